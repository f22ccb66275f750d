//! Daemon mode: `rttscope observe --listen` against real TCP traffic between
//! two namespaces, scraped over HTTP and read with a Prometheus text-format
//! parser (prometheus-parse). Truths: the transactions the test's own client
//! completed, the kernel's sample counter, the addresses the test created.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use prometheus_parse::{Sample, Scrape, Value};
use rttscope_e2e::*;

const PORT: u16 = 5001;

fn server_addr() -> SocketAddr {
    format!("{B_ADDR}:{PORT}").parse().unwrap()
}

/// A free loopback port (the observer binds it right after).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path`: (status, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // As Prometheus asks when it prefers OpenMetrics.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    assert!(
        code != 200 || head.contains("Content-Type: application/openmetrics-text"),
        "{head}"
    );
    Ok((code, body.to_string()))
}

/// Scrape and parse; every data line must have been understood by the parser.
/// Scrape until `settled` holds (the observer has read what the traffic left in the kernel: its
/// reads run every 300 ms, but a starved observer on a loaded 2-core machine was seen more than
/// 1.5 s behind), at most 20 s; the last scrape either way, for the test's own assertions to judge
/// and print: a real loss never settles and still fails them.
fn scrape_settled(port: u16, settled: impl Fn(&Scrape) -> bool) -> (Scrape, String) {
    let t0 = std::time::Instant::now();
    loop {
        let (s, body) = scrape(port);
        if settled(&s) || t0.elapsed() > Duration::from_secs(20) {
            return (s, body);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn scrape(port: u16) -> (Scrape, String) {
    let (code, body) = http_get(port, "/metrics").expect("scrape");
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    let parsed = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    let data_lines = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let parsed_points: usize = parsed
        .samples
        .iter()
        .map(|s| match &s.value {
            Value::Histogram(h) => h.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(
        data_lines, parsed_points,
        "the parser understood every line of the exposition"
    );
    (parsed, body)
}

/// A scrape without an Accept header is the Prometheus text format and
/// `promtool check metrics` (Prometheus' linter) finds nothing to say.
fn promtool_checks_a_text_scrape(port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "promtool check metrics on a live scrape: {}{}\n{body}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
}

fn start_observer(port: u16, extra: &[&str]) -> ChildGuard {
    let mut cmd = Command::new(rttscope_bin());
    cmd.arg("observe")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--quiet", "--interval", "300ms", "--duration", "60s"])
        .args(extra);
    let g = ChildGuard::spawn(&mut cmd).unwrap();
    let t0 = Instant::now();
    while http_get(port, "/metrics").is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "observer did not serve /metrics within 15 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    g
}

/// The RTT histogram series with these label values: (count, sum, buckets).
fn rtt_series<'a>(s: &'a Scrape, want: &[(&str, &str)]) -> Vec<&'a Sample> {
    s.samples
        .iter()
        .filter(|x| x.metric == "rttscope_rtt_seconds")
        .filter(|x| want.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect()
}

fn hist_total(x: &Sample) -> f64 {
    match &x.value {
        Value::Histogram(h) => {
            // Cumulative and monotone; +Inf holds the total.
            assert!(
                h.windows(2)
                    .all(|w| w[0].count <= w[1].count && w[0].less_than < w[1].less_than),
                "buckets cumulative: {h:?}"
            );
            let inf = h.last().unwrap();
            assert!(inf.less_than.is_infinite());
            inf.count
        }
        v => panic!("not a histogram: {v:?}"),
    }
}

fn untyped(s: &Scrape, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .filter(|x| x.metric == metric)
        .find(|x| want.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            Value::Untyped(v) | Value::Counter(v) | Value::Gauge(v) => v,
            _ => f64::NAN,
        })
}

/// The tests that open thousands of connections or keep dozens busy take turns: side by side
/// on two cores, the 5,000-address test's connects failed (83 of 5,000) beside the churn test's
/// 15,000 a second, and once beside the 24 busy connections of the eviction test.
static CONNECTION_STORMS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn scraped_histograms_grow_with_traffic() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let port = free_port();
    let obs = start_observer(
        port,
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--label-port",
            "5001",
            "--view",
            "tcp,sampler",
            "--iface",
            &format!("{}:{}", p.b.name, p.b_if),
        ],
    );
    let (code, _) = http_get(port, "/nothing").unwrap();
    assert_eq!(code, 404);

    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let (s1, _) = scrape(port);
    std::thread::sleep(Duration::from_millis(800));
    cli.pause();
    // Two read intervals after the last transaction: everything is exported.
    std::thread::sleep(Duration::from_millis(800));
    let transactions = cli.transactions.load(Ordering::Relaxed) as f64;
    let (s2, body) = scrape(port);
    promtool_checks_a_text_scrape(port);

    let client = [
        ("view", "tcp"),
        ("side", "client"),
        ("netns", p.a.name.as_str()),
        ("remote_prefix", "10.77.0.0/24"),
        ("local_port", "other"),
    ];
    let server = [
        ("view", "tcp"),
        ("side", "server"),
        ("netns", p.b.name.as_str()),
        ("remote_prefix", "10.77.0.0/24"),
        ("local_port", "5001"),
    ];
    let get = |s: &Scrape, l: &[(&str, &str)]| {
        let v = rtt_series(s, l);
        assert_eq!(v.len(), 1, "one series for {l:?} in:\n{body}");
        hist_total(v[0])
    };
    let (c1, c2) = (get(&s1, &client), get(&s2, &client));
    let (v1, v2) = (get(&s1, &server), get(&s2, &server));
    eprintln!("scrapes: client {c1} -> {c2}, server {v1} -> {v2}; transactions {transactions}");
    assert!(
        c1 > 20.0 && v1 > 20.0,
        "first scrape has samples: client {c1}, server {v1}"
    );
    assert!(
        c2 > c1 + 20.0 && v2 > v1 + 20.0,
        "counts grow with traffic: client {c1} -> {c2}, server {v1} -> {v2}"
    );
    // Independent truth: one RTT sample per completed transaction on the
    // client (its request is acknowledged by the response), +-3% and a
    // couple for the handshake and the last, unanswered ACK.
    let tol = (0.03 * transactions).max(3.0);
    assert!(
        (c2 - transactions).abs() <= tol,
        "client samples {c2} vs transactions {transactions} (tolerance {tol})"
    );
    assert_the_other_series(&s2, &body, &client, (c2, v2));
    assert_three_capabilities_and_nobody(obs.pid());
    let (s3, body3) = scrape(port);
    assert!(
        get(&s3, &client) >= c2,
        "scrapes work as uid 65534:\n{body3}"
    );
    assert!(
        body3.contains("rttscope_bpf_prog_run_count_total{prog=\"tcp_sockops\""),
        "program statistics found through /proc/self/fdinfo as uid 65534:\n{body3}"
    );
    assert_sigterm_ends_it_cleanly_after_listing_hooks(obs);
}

/// Beside the client's and server's TCP series: the sampler's, the kernel's sample counter
/// (covering both ends), the client's mean (a veth: below 5 ms), flows, no drop, no overflow,
/// program statistics.
fn assert_the_other_series(s2: &Scrape, body: &str, client: &[(&str, &str)], (c2, v2): (f64, f64)) {
    // The sampler view is exported next to the TCP view.
    let sampled: f64 = rtt_series(s2, &[("view", "sampler")])
        .iter()
        .map(|x| hist_total(x))
        .sum();
    eprintln!("sampler samples {sampled}");
    assert!(sampled > 20.0, "sampler series in:\n{body}");
    // The kernel's own sample counter covers both ends.
    let samples = untyped(s2, "rttscope_samples_total", &[("view", "tcp")]).unwrap();
    assert!(
        samples >= c2 + v2,
        "samples_total {samples} >= client {c2} + server {v2}"
    );
    // The client's mean RTT is that of a veth in one host: well below 5 ms.
    let csum = untyped(s2, "rttscope_rtt_seconds_sum", client).unwrap();
    assert!(
        csum / c2 > 0.0 && csum / c2 < 0.005,
        "client mean {} s",
        csum / c2
    );
    assert!(untyped(s2, "rttscope_flows_tracked", &[("view", "tcp")]).unwrap() >= 2.0);
    assert_eq!(
        untyped(
            s2,
            "rttscope_drops_total",
            &[("view", "tcp"), ("reason", "flow_map_full")]
        ),
        Some(0.0)
    );
    assert_eq!(
        untyped(s2, "rttscope_series_overflow_total", &[("view", "tcp")]),
        Some(0.0),
        "no overflow below the cap"
    );
    // Program statistics are exported per program.
    assert!(
        body.contains("rttscope_bpf_prog_run_count_total{prog=\"tcp_sockops\""),
        "{body}"
    );
}

/// Capabilities dropped to the three after attach, no new privileges, running as nobody.
fn assert_three_capabilities_and_nobody(pid: u32) {
    // Capabilities were dropped to the three after attach.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        eff,
        (1 << 12) | (1 << 38) | (1 << 39),
        "CapEff {eff:x}: only CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF"
    );
    assert!(status.contains("NoNewPrivs:\t1"));
    // ...and it runs as nobody, not uid 0 (issue 18 item 9), still serving.
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect()
    };
    assert_eq!(ids("Uid:"), vec![65534; 4], "{status}");
    assert_eq!(ids("Gid:"), vec![65534; 4], "{status}");
}

/// SIGTERM: a clean exit; its start-up listed the hooks of both views.
fn assert_sigterm_ends_it_cleanly_after_listing_hooks(obs: ChildGuard) {
    // SIGTERM: clean exit.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(obs.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = obs.wait_output(Duration::from_secs(10)).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("attached: tcp view"),
        "startup lists hooks: {err}"
    );
    assert!(
        err.contains("attached: sampler view: "),
        "startup lists the sampler's hooks: {err}"
    );
}

/// 5,000 distinct client addresses connect to one server: with /32 labels
/// and a cap of 100 series, the exporter must keep 100 series plus the
/// overflow series, count the overflow, and lose no sample.
#[test]
fn series_cap_holds_under_5000_remote_addresses() {
    if !require_root() {
        return;
    }
    let _one = CONNECTION_STORMS.lock().unwrap_or_else(|e| e.into_inner());
    const N: u32 = 5000;
    let p = Pair::new().unwrap();
    addresses_on_a_routed_back_from_b(&p, N);

    let port = free_port();
    let obs = start_observer(
        port,
        &[
            "--netns",
            &p.b.name,
            "--v4-prefix",
            "32",
            "--max-series",
            "100",
            "--label-port",
            "5001",
        ],
    );
    let (done, served, took) = one_transaction_from_each_address(&p, N);
    assert!(
        done >= N * 99 / 100,
        "{done} of {N} connections completed ({served} served) in {took:?}"
    );
    // Let the observer read the last closes (several intervals): every sample in some series.
    std::thread::sleep(Duration::from_millis(1500));
    let (s, body) = scrape_settled(port, |s| {
        let total: f64 = rtt_series(s, &[("view", "tcp")])
            .iter()
            .map(|x| hist_total(x))
            .sum();
        untyped(s, "rttscope_samples_total", &[("view", "tcp")]) == Some(total)
            && untyped(s, "rttscope_flows_tracked", &[("view", "tcp")]).is_some_and(|t| t < 100.0)
    });
    let series = rtt_series(&s, &[("view", "tcp")]);
    let overflow: Vec<_> = series
        .iter()
        .filter(|x| x.labels.get("remote_prefix") == Some("overflow"))
        .collect();
    let normal = series.len() - overflow.len();
    assert_eq!(normal, 100, "series capped at 100 (got {normal})");
    assert_eq!(overflow.len(), 1, "one overflow series");
    assert_eq!(untyped(&s, "rttscope_series", &[]), Some(100.0));
    let total: f64 = series.iter().map(|x| hist_total(x)).sum();
    let in_overflow = hist_total(overflow[0]);
    let counted = untyped(&s, "rttscope_series_overflow_total", &[("view", "tcp")]).unwrap();
    assert_eq!(
        counted, in_overflow,
        "overflow counter = samples in the overflow series"
    );
    assert!(
        in_overflow > total * 0.9,
        "most of {N} remotes went to overflow: {in_overflow} of {total}"
    );
    // Conservation: every sample the kernel counted is in some series.
    let samples = untyped(&s, "rttscope_samples_total", &[("view", "tcp")]).unwrap();
    assert_eq!(
        total, samples,
        "histogram counts over all series {total} vs samples_total {samples}"
    );
    // Closed flows were reported and forgotten: the map is (nearly) empty again.
    let tracked = untyped(&s, "rttscope_flows_tracked", &[("view", "tcp")]).unwrap();
    assert!(tracked < 100.0, "flows still tracked: {tracked}");
    let lines = body.lines().count();
    eprintln!(
        "{done} connections in {took:?}: {normal} series + overflow {in_overflow} of {total} samples, samples_total {samples}, tracked {tracked}, {lines} lines"
    );
    assert!(
        lines < 101 * 50 + 200,
        "exposition stays bounded: {lines} lines"
    );
    drop(obs);
}

/// `n` addresses 10.88.x.y/32 on a's interface; b routes them back via a.
fn addresses_on_a_routed_back_from_b(p: &Pair, n: u32) {
    let mut batch = String::new();
    for i in 0..n {
        batch += &format!(
            "addr add 10.88.{}.{}/32 dev {}\n",
            i / 250,
            1 + i % 250,
            p.a_if
        );
    }
    let file = std::env::temp_dir().join(format!("{}.ipbatch", p.a.name));
    std::fs::write(&file, batch).unwrap();
    p.a.exec(&["ip", "-b", file.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&file);
    p.b.exec(&["ip", "route", "add", "10.88.0.0/16", "via", A_ADDR])
        .unwrap();
}

/// A server in b that answers one byte per connection, then closes, and one connection with one
/// transaction from each of the `n` addresses in a (a connect that fails is tried again):
/// (transactions completed, served, how long it took).
fn one_transaction_from_each_address(p: &Pair, n: u32) -> (u32, u32, Duration) {
    // A server that answers one byte per connection, then closes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let srv = p.b.spawn(move || {
        let l = TcpListener::bind(server_addr()).unwrap();
        l.set_nonblocking(true).unwrap();
        let mut served = 0u32;
        while !stop2.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).is_ok() && s.write_all(b"r").is_ok() {
                        served += 1;
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        served
    });
    let t0 = Instant::now();
    let done = p.a.run(move || {
        let (mut ok, mut errors) = (0u32, std::collections::BTreeMap::new());
        for i in 0..n {
            let src: SocketAddr = format!("10.88.{}.{}:0", i / 250, 1 + i % 250)
                .parse()
                .unwrap();
            // A connect that fails at once (seen beside the other tests on two cores: 83 and
            // 100 of 5,000, never alone) is tried again from the same address, up to 3 times:
            // the load must reach 5,000 addresses; the failures are printed.
            for _ in 0..3 {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                s.bind(&src.into()).unwrap();
                if let Err(e) = s.connect_timeout(&server_addr().into(), Duration::from_secs(2)) {
                    *errors.entry(e.kind().to_string()).or_insert(0u32) += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let mut s: TcpStream = s.into();
                let mut b = [0u8; 1];
                if s.write_all(b"q").is_ok() && s.read_exact(&mut b).is_ok() {
                    ok += 1;
                }
                break;
            }
        }
        if !errors.is_empty() {
            eprintln!("series_cap: connect failures tried again: {errors:?}");
        }
        ok
    });
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let served = srv.join().unwrap();
    (done, served, took)
}

/// `--check-config`: a good file prints OK and exits 0; each kind of bad file
/// is one line on stderr and exit status 1 (no privileges needed).
#[test]
fn check_config_one_sentence_each() {
    let dir = std::env::temp_dir().join(unique("rtscfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "good",
            "interval = \"2s\"\nlisten = \"127.0.0.1:9464\"\n[labels]\nports = [443]\n",
            None,
        ),
        ("syntax", "interval = \"2s\nlisten = 1\n", Some("line 1")),
        (
            "unknown",
            "[labels]\nv4prefix = 24\n",
            Some("unknown field `v4prefix`"),
        ),
        (
            "prefix",
            "[labels]\nv6_prefix = 129\n",
            Some("IPv6 label prefix must be 0..128 bits, not 129"),
        ),
        (
            "interval",
            "interval = \"0\"\n",
            Some("interval must be at least 10ms"),
        ),
        (
            "listen",
            "listen = \"everywhere\"\n",
            Some("'everywhere' is not a listen address"),
        ),
    ];
    for (name, text, want) in cases {
        let f = dir.join(format!("{name}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = Command::new(rttscope_bin())
            .args(["observe", "--config", f.to_str().unwrap(), "--check-config"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        match want {
            None => {
                assert!(out.status.success(), "{name}: {err}");
                assert!(String::from_utf8_lossy(&out.stdout).contains(": OK"));
            }
            Some(w) => {
                assert_eq!(out.status.code(), Some(1), "{name}: {err}");
                assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
                assert!(
                    err.starts_with("rttscope: config file ") && err.contains(w),
                    "{name}: {err}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/metrics` is not starved by slow clients: 48 connections that send a
/// partial request line (`GET /metr`) and hold it, plus 4 that send nothing,
/// do not delay a normal scrape (answered within 2 s; the hand-written server
/// with 16 slots and 10 s timeouts took 19.5 s with 40 such connections), and
/// the server closes every held connection at its header-read timeout (5 s).
#[test]
fn slow_clients_do_not_starve_scrapes() {
    if !require_root() {
        return;
    }
    const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
    let port = free_port();
    let obs = start_observer(port, &[]);
    let t_open = Instant::now();
    let mut held = Vec::new();
    for i in 0..52 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        if i < 48 {
            s.write_all(b"GET /metr").unwrap();
        }
        held.push(s);
    }
    // Let the server take them in before the scrape arrives.
    std::thread::sleep(Duration::from_millis(300));

    let t0 = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect scrape");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    let r = s.read_to_string(&mut out);
    let took = t0.elapsed();
    eprintln!(
        "scrape with 48 half-sent + 4 idle connections held: {took:?}, {} bytes",
        out.len()
    );
    assert!(r.is_ok(), "scrape failed after {took:?}: {r:?}");
    assert!(
        out.starts_with("HTTP/1.1 200 ") && out.contains("# TYPE rttscope_rtt_seconds histogram"),
        "after {took:?}: {}",
        &out[..out.len().min(200)]
    );
    assert!(
        took < Duration::from_secs(2),
        "scrape took {took:?} with slow clients held (want < 2 s)"
    );

    // Every held connection is closed by the server (EOF or reset) at the
    // header-read timeout, not before 4 s and not after timeout + 2 s.
    let mut latest = Duration::ZERO;
    for (i, mut c) in held.into_iter().enumerate() {
        let deadline = HEADER_READ_TIMEOUT + Duration::from_secs(2);
        let left = deadline.saturating_sub(t_open.elapsed());
        c.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .unwrap();
        let mut b = [0u8; 256];
        let r = c.read(&mut b);
        let at = t_open.elapsed();
        let closed = match &r {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        assert!(
            closed,
            "held connection {i} not closed by the server {at:?} after opening: {r:?}"
        );
        assert!(
            at >= HEADER_READ_TIMEOUT - Duration::from_secs(1),
            "held connection {i} closed too early ({at:?}): {r:?}"
        );
        latest = latest.max(at);
    }
    eprintln!("52 held connections closed by the server within {latest:?} of opening");
    // And the endpoint still answers afterwards.
    let (code, _) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    drop(obs);
}

/// Sum of `_count` over every RTT series of `view` (overflow included).
/// Every sample of `view` counted in `samples_total` is in some histogram's `_count` or in a drop
/// counter (`samples_evicted`, `samples_not_binned`).
fn all_accounted(s: &Scrape, view: &str) -> bool {
    let drop = |r| untyped(s, "rttscope_drops_total", &[("view", view), ("reason", r)]);
    let accounted = view_count(s, view)
        + drop("samples_evicted").unwrap_or(0.0)
        + drop("samples_not_binned").unwrap_or(0.0);
    untyped(s, "rttscope_samples_total", &[("view", view)]) == Some(accounted)
}

fn view_count(s: &Scrape, view: &str) -> f64 {
    rtt_series(s, &[("view", view)])
        .iter()
        .map(|x| hist_total(x))
        .sum()
}

/// The observer's peak RSS so far (kB).
fn vm_hwm_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Connection churn (issue 18 item 7, issue 26.4): thousands of short connections a
/// second through tables of 4,096 entries, so that sampler flows are evicted, often before a
/// read saw all their samples, the fine-histogram pool (256 entries a half) and its overflow
/// ring fill up, and ports are taken again while the closed connection is still in the TCP
/// view's table. Every sample the kernel counted must be in a histogram or counted as lost, in
/// both views: samples_total = sum of `_count` + drops{reason="samples_evicted"} +
/// drops{reason="samples_not_binned"}. Before, the samples of evicted (and re-entered) flows
/// were missing without a word; then (at 4,096, not at 64) the sampler counted a not-binned
/// sample of an evicted flow twice (137,786 taken, 160,673 accounted for) and the TCP view lost
/// the samples of a connection whose 4-tuple a closed one still held (8,195 taken, 8,084
/// exported).
#[test]
fn sampler_samples_are_all_accounted_under_connection_churn() {
    if !require_root() {
        return;
    }
    let _one = CONNECTION_STORMS.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: usize = 4;
    let p = Pair::new().unwrap();
    let addr: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let port = free_port();
    // RTTSCOPE_CHURN_MAX_FLOWS: another table size, to measure the
    // observer's memory under churn (docs/perf-metrics.md).
    let max_flows = std::env::var("RTTSCOPE_CHURN_MAX_FLOWS").unwrap_or_else(|_| "4096".into());
    let obs = start_observer(
        port,
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--view",
            "tcp,sampler",
            "--iface",
            &format!("{}:{}", p.b.name, p.b_if),
            "--max-flows",
            &max_flows,
        ],
    );
    let hwm_start = vm_hwm_kb(obs.pid());
    let (done, took) = churn_through_threads(&p, addr, THREADS);
    // Several read intervals (300 ms) after the last connection, until both views' samples are
    // all accounted (in some _count, or counted as dropped).
    std::thread::sleep(Duration::from_millis(1500));
    let (s, body) = scrape_settled(port, |s| {
        all_accounted(s, "sampler") && all_accounted(s, "tcp")
    });
    let samples = untyped(&s, "rttscope_samples_total", &[("view", "sampler")]).unwrap();
    let counted = view_count(&s, "sampler");
    let evicted = untyped(
        &s,
        "rttscope_drops_total",
        &[("view", "sampler"), ("reason", "samples_evicted")],
    );
    let ev = |e: &str| {
        untyped(
            &s,
            "rttscope_view_events_total",
            &[("view", "sampler"), ("event", e)],
        )
        .unwrap_or(f64::NAN)
    };
    let flows_evicted = ev("flows_evicted");
    let hwm = vm_hwm_kb(obs.pid());
    eprintln!(
        "{done} connections in {took:?} ({:.0}/s): sampler samples_total {samples}, sum of _count {counted}, samples_evicted {evicted:?}, flows_evicted {flows_evicted}, pending_evicted {}, flow_map_full {}; tcp samples_total {:?}, sum of _count {}; VmHWM {hwm_start} -> {hwm} kB",
        done as f64 / took.as_secs_f64(),
        ev("pending_evicted"),
        ev("flow_map_full"),
        untyped(&s, "rttscope_samples_total", &[("view", "tcp")]),
        view_count(&s, "tcp"),
    );
    assert!(done > 2000, "churn: only {done} connections");
    assert!(
        flows_evicted > 0.0,
        "the {max_flows}-entry table evicted flows with samples: {flows_evicted}\n{body}"
    );
    let evicted = evicted.unwrap_or_else(|| panic!("no samples_evicted drop counter:\n{body}"));
    // samples the fine-histogram pool and its overflow ring could not hold
    // between two reads (a counted loss; docs/metrics.md "Kernel memory")
    let not_binned = untyped(
        &s,
        "rttscope_drops_total",
        &[("view", "sampler"), ("reason", "samples_not_binned")],
    )
    .unwrap_or_else(|| panic!("no samples_not_binned drop counter:\n{body}"));
    assert_eq!(
        samples,
        counted + evicted + not_binned,
        "samples_total {samples} = sum of _count {counted} + samples_evicted {evicted} + samples_not_binned {not_binned}"
    );
    assert_tcp_samples_all_accounted(&s, &body);
    sigterm_exits_cleanly(obs);
}

/// `threads` accepting threads in b answering one byte per connection, and `threads` clients
/// in a opening a connection (RST at close), one transaction, for 4 s: (transactions, time).
fn churn_through_threads(p: &Pair, addr: SocketAddr, threads: usize) -> (u64, Duration) {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let listener = p.b.run(move || TcpListener::bind(addr).unwrap());
    listener.set_nonblocking(true).unwrap();
    let servers: Vec<_> = (0..threads)
        .map(|_| {
            let l = listener.try_clone().unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((mut s, _)) => {
                            s.set_nonblocking(false).unwrap();
                            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                            let mut b = [0u8; 1];
                            if s.read_exact(&mut b).is_ok() {
                                let _ = s.write_all(b"r");
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_micros(100)),
                    }
                }
            })
        })
        .collect();
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..threads)
        .map(|_| {
            let done = done.clone();
            p.a.spawn(move || {
                while t0.elapsed() < Duration::from_secs(4) {
                    let s =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                            .unwrap();
                    // RST at close: no TIME_WAIT, so the ports last.
                    s.set_linger(Some(Duration::ZERO)).unwrap();
                    if s.connect_timeout(&addr.into(), Duration::from_secs(2))
                        .is_err()
                    {
                        continue;
                    }
                    let mut s: TcpStream = s.into();
                    let mut b = [0u8; 1];
                    if s.write_all(b"q").is_ok() && s.read_exact(&mut b).is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for s in servers {
        s.join().unwrap();
    }
    let done = done.load(Ordering::Relaxed);
    (done, took)
}

/// The TCP view's identity too (issue 26.4: it lost 4.6% without a counter at 100,000
/// connections); its flows are given back by the reader after their last read, so
/// samples_evicted and samples_not_binned are 0 unless the table or the pool overflows.
fn assert_tcp_samples_all_accounted(s: &Scrape, body: &str) {
    let tcp_lost = |reason: &str| {
        untyped(
            s,
            "rttscope_drops_total",
            &[("view", "tcp"), ("reason", reason)],
        )
        .unwrap_or(0.0)
    };
    let tcp_samples = untyped(s, "rttscope_samples_total", &[("view", "tcp")]).unwrap();
    let tcp_counted = view_count(s, "tcp");
    let (tcp_ev, tcp_nb) = (tcp_lost("samples_evicted"), tcp_lost("samples_not_binned"));
    assert!(tcp_samples > 0.0, "no TCP samples:\n{body}");
    assert_eq!(
        tcp_samples,
        tcp_counted + tcp_ev + tcp_nb,
        "tcp: samples_total {tcp_samples} = sum of _count {tcp_counted} + samples_evicted {tcp_ev} + samples_not_binned {tcp_nb}"
    );
}

/// SIGTERM: the observer exits 0.
fn sigterm_exits_cleanly(obs: ChildGuard) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(obs.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = obs.wait_output(Duration::from_secs(10)).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The host's namespace is `host` in /metrics after the switch to uid 65534, in every
/// scrape, and no label names a PID (issue 26.3: it was `pid:<own pid>`, and changed mid-run).
#[test]
fn host_namespace_is_host_and_labels_never_change() {
    if !require_root() {
        return;
    }
    // A server on the host's loopback, on a port labelled by its number.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let lport = listener.local_addr().unwrap().port();
    let port = free_port();
    let obs = start_observer(port, &["--view", "tcp", "--label-port", &lport.to_string()]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    let srv = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
    });
    let cli = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", lport)).unwrap();
        let mut b = [0u8; 1];
        while !st.load(Ordering::Relaxed) {
            c.write_all(b"x").unwrap();
            c.read_exact(&mut b).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let status = std::fs::read_to_string(format!("/proc/{}/status", obs.pid())).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        let (s, body) = scrape(port);
        let ours = rtt_series(&s, &[("view", "tcp"), ("local_port", &lport.to_string())]);
        let names: std::collections::BTreeSet<&str> =
            ours.iter().filter_map(|x| x.labels.get("netns")).collect();
        assert!(
            !body.contains("netns=\"pid:"),
            "a label names a PID:\n{body}"
        );
        seen.push(format!("{names:?}"));
    }
    stop.store(true, Ordering::Relaxed);
    cli.join().unwrap();
    let _ = srv.join();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
    eprintln!("netns labels of port {lport} per scrape: {seen:?}; {uid_line}");
    assert!(
        seen.iter().all(|s| s == "{\"host\"}"),
        "the host's namespace is `host` in every scrape: {seen:?}"
    );
}

/// Issue 26.6/26.10/27.6 against a live observer with both views: the
/// protobuf format carries native buckets that add up to the classic
/// `_count`; levels are gauges (never counters); every view has
/// `rttscope_flows_tracked`; drops and evictions apart; and a storm of
/// concurrent scrapers is served from the one prepared render: every scrape
/// answered, the observer's peak RSS bounded (figures, not timing, are
/// asserted; scripts/bench-metrics.sh storm measures the 2,000-scraper case).
#[test]
fn protobuf_native_buckets_gauges_and_a_scrape_storm() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 100).unwrap();
    let port = free_port();
    let iface = format!("{}:{}", p.b.name, p.b_if);
    let obs = start_observer(
        port,
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--view",
            "tcp,sampler",
            "--iface",
            &iface,
        ],
    );
    let clients: Vec<RrClient> = (0..4)
        .map(|_| RrClient::start(&p.a, server_addr(), 100, Duration::from_millis(2)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_secs(3));

    let fams = protobuf_scrape_with_native_buckets(port);
    assert_levels_are_gauges_and_evictions_no_drops(&fams, port);

    // The storm.
    let pid = obs.pid();
    let (hwm0, rss0) = rss_kb(pid);
    let storm = scrape_storm(port, 300, Duration::from_secs(6));
    let (hwm1, rss1) = rss_kb(pid);
    eprintln!(
        "storm: 300 scrapers for 6 s: {} answered, {} failed, p50 {:?}, p99 {:?}, slowest {:?}; observer VmHWM {} -> {} kB, VmRSS {} -> {} kB",
        storm.ok, storm.failed, storm.pct(0.5), storm.pct(0.99), storm.slowest, hwm0, hwm1, rss0, rss1
    );
    assert!(storm.ok > 300, "{storm:?}");
    assert_eq!(storm.failed, 0, "every scrape answered");
    // 256 connections at most, each holding a shared body: tens of MB would
    // mean a copy per scrape (the body alone is ~100 kB here).
    assert!(
        hwm1 < hwm0 + 48 * 1024,
        "peak RSS grew from {hwm0} to {hwm1} kB"
    );
    drop(clients);
}

/// A protobuf scrape (what Prometheus asks for with native histograms enabled): every RTT series
/// with samples has native buckets adding up to its count (2 series at least); its families.
fn protobuf_scrape_with_native_buckets(
    port: u16,
) -> Vec<rttscope::sinks::prometheus::proto::MetricFamily> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;q=0.3\r\n\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    assert!(head.contains("application/vnd.google.protobuf"), "{head}");
    let fams = rttscope::sinks::prometheus::proto::decode(&out[split + 4..]).unwrap();
    let rtt = fams
        .iter()
        .find(|f| f.name == "rttscope_rtt_seconds")
        .expect("rtt family");
    let mut natives = 0;
    for m in &rtt.metric {
        let h = m.histogram.as_ref().unwrap();
        if h.sample_count == 0 {
            continue;
        }
        assert!(h.schema <= 3 && h.schema >= -4, "{h:?}");
        let mut acc = 0i64;
        let total: i64 = h
            .positive_delta
            .iter()
            .map(|d| {
                acc += d;
                acc
            })
            .sum();
        assert_eq!(
            total as u64 + h.zero_count,
            h.sample_count,
            "native buckets add up to the count: {m:?}"
        );
        let spans: u32 = h.positive_span.iter().map(|s| s.length).sum();
        assert_eq!(spans as usize, h.positive_delta.len());
        assert!(spans <= 160);
        natives += 1;
    }
    assert!(natives >= 2, "RTT series with native buckets: {natives}");
    fams
}

/// Levels are gauges; every view has rttscope_flows_tracked; evictions are not drops, and
/// ring-buffer drops have one name.
fn assert_levels_are_gauges_and_evictions_no_drops(
    fams: &[rttscope::sinks::prometheus::proto::MetricFamily],
    port: u16,
) {
    let kind = |name: &str| fams.iter().find(|f| f.name == name).map(|f| f.r#type);
    assert_eq!(kind("rttscope_view_level"), Some(1), "gauge");
    assert_eq!(kind("rttscope_flows_tracked"), Some(1), "gauge");
    let (_, text) = scrape(port);
    for view in ["tcp", "sampler"] {
        assert!(
            text.contains(&format!("rttscope_flows_tracked{{view=\"{view}\"}}")),
            "{view}: {text}"
        );
    }
    for level in ["flows_live", "pending_live", "flows_tracked"] {
        assert!(
            !text.contains(&format!("event=\"{level}\"")),
            "{level} exported as a counter"
        );
    }
    assert!(
        !text.contains("reason=\"flows_evicted\""),
        "evictions are not drops"
    );
    assert!(
        text.contains("rttscope_evictions_total{view=\"sampler\",event=\"flows_evicted\"}"),
        "{text}"
    );
    assert!(
        !text.contains("raw_drops"),
        "one name for ring-buffer drops"
    );
}

/// Live flows evicted from a full TCP table (issue 26.4): 24 busy connections (48 flows) on a
/// 16-slot table, so every read evicts the least recently active flows while they keep
/// sending. A sample that arrives between an evicted flow's last read and the give-back of its
/// slot is counted (`samples_evicted`, drained from the fine-histogram pool afterwards), and
/// samples_total = sum of `_count` + samples_evicted + samples_not_binned holds exactly.
/// Before, such samples went to a histogram nobody read again, uncounted.
#[test]
fn tcp_samples_of_evicted_live_flows_are_accounted() {
    if !require_root() {
        return;
    }
    let _one = CONNECTION_STORMS.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let port = free_port();
    let obs = start_observer(
        port,
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--max-flows",
            "16",
        ],
    );
    let clients: Vec<_> = (0..24)
        .map(|_| RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(1)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    for c in &clients {
        c.pause();
    }
    // Several read intervals (300 ms) after the last sample, until every sample is accounted.
    std::thread::sleep(Duration::from_millis(1500));
    let (s, body) = scrape_settled(port, |s| all_accounted(s, "tcp"));
    let lost = |reason: &str| {
        untyped(
            &s,
            "rttscope_drops_total",
            &[("view", "tcp"), ("reason", reason)],
        )
        .unwrap_or_else(|| panic!("no drops_total{{view=tcp,reason={reason}}}:\n{body}"))
    };
    let samples = untyped(&s, "rttscope_samples_total", &[("view", "tcp")]).unwrap();
    let counted = view_count(&s, "tcp");
    let (evicted, not_binned) = (lost("samples_evicted"), lost("samples_not_binned"));
    let flows_evicted = untyped(
        &s,
        "rttscope_view_events_total",
        &[("view", "tcp"), ("event", "flows_evicted")],
    )
    .unwrap_or(f64::NAN);
    eprintln!(
        "evicting live flows: samples_total {samples}, sum of _count {counted}, samples_evicted {evicted}, samples_not_binned {not_binned}, flows_evicted {flows_evicted}"
    );
    assert!(flows_evicted > 0.0, "no live flow evicted:\n{body}");
    assert_eq!(
        samples,
        counted + evicted + not_binned,
        "samples_total {samples} = sum of _count {counted} + samples_evicted {evicted} + samples_not_binned {not_binned}"
    );
    drop(clients);
    drop(obs);
}
