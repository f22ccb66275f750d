//! The two BPF loaders (libbpf, aya) against the same traffic.
//!
//! Needs a binary with both loaders: `cargo build --features aya`.
//! Truths: the transactions the test's own RR client completed (one TCP RTT
//! sample per transaction on each end), and the other loader.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use rttscope_e2e::*;

const PORT: u16 = 5003;

fn server_addr() -> SocketAddr {
    format!("{B_ADDR}:{PORT}").parse().unwrap()
}

/// A running `observe --format json` whose lines arrive on a channel.
struct Observer {
    child: ChildGuard,
    lines: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
}

impl Observer {
    fn start(loader: &str, p: &Pair, duration: &str, extra: &[&str]) -> Observer {
        let mut cmd = Command::new(rttscope_bin());
        cmd.args([
            "observe",
            "--format",
            "json",
            "--loader",
            loader,
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--interval",
            "500ms",
            "--duration",
            duration,
        ])
        .args(extra)
        .env_remove("RTTSCOPE_LOADER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(&mut cmd).unwrap();
        let out = child.0.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        Observer {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Wait for the `start` line (programs loaded and attached).
    fn wait_attached(&mut self, loader: &str) {
        match self.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(v) => {
                assert_eq!(v["type"], "start", "{loader}: first line: {v}");
                assert_eq!(v["settings"]["loader"], loader, "{loader}: {v}");
                self.seen.push(v);
            }
            Err(_) => {
                let out = std::mem::replace(&mut self.child, ChildGuard(None))
                    .wait_output(Duration::from_secs(5));
                panic!("{loader}: observer printed no start line: {out:?}");
            }
        }
    }

    /// Wait for exit; all lines.
    fn finish(mut self, loader: &str) -> Vec<serde_json::Value> {
        let out = std::mem::replace(&mut self.child, ChildGuard(None))
            .wait_output(Duration::from_secs(30))
            .unwrap();
        assert!(
            out.status.success(),
            "{loader}: observer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.seen.extend(self.lines.try_iter());
        assert!(
            self.seen.iter().any(|l| l["type"] == "end"),
            "{loader}: no end line: {:?}",
            self.seen
        );
        self.seen
    }
}

/// (n, sparse histogram [lo, hi, count]...) of a flow in the end line.
fn flow_hist(
    lines: &[serde_json::Value],
    ns: &str,
    local: &str,
    what: &str,
) -> (u64, Vec<(f64, u64)>) {
    let f = end_flow(lines, ns, local)
        .unwrap_or_else(|| panic!("{what}: flow {local} in {ns} not in the end line: {lines:#?}"));
    let n = f["tcp"]["summary"]["n"].as_u64().unwrap();
    let h = f["tcp"]["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b[0].as_f64().unwrap(), b[2].as_u64().unwrap()))
        .collect();
    (n, h)
}

fn p50(lines: &[serde_json::Value], ns: &str, local: &str) -> f64 {
    end_flow(lines, ns, local).unwrap()["tcp"]["summary"]["p50_us"]
        .as_f64()
        .unwrap()
}

/// Raw TCP sample lines of one flow (same netns inode as in the end line).
fn raw_samples(lines: &[serde_json::Value], ns: &str, local: &str) -> u64 {
    let netns = end_flow(lines, ns, local).map(|f| f["netns"].clone());
    lines
        .iter()
        .filter(|l| l["type"] == "sample" && l["view"] == "tcp" && l["local"] == local)
        .filter(|l| netns.as_ref() == Some(&l["netns"]))
        .count() as u64
}

/// Sum over buckets of |a - b|.
fn hist_distance(a: &[(f64, u64)], b: &[(f64, u64)]) -> u64 {
    let mut m: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    for (lo, c) in a {
        m.entry(lo.to_bits()).or_default().0 += c;
    }
    for (lo, c) in b {
        m.entry(lo.to_bits()).or_default().1 += c;
    }
    m.values().map(|(x, y)| x.abs_diff(*y)).sum()
}

/// Both loaders attached at once to the same flows: every RTT callback runs
/// both programs, so both must report the same samples (up to a sample at
/// the edges), and as many as the client made transactions.
#[test]
fn both_loaders_see_the_same_samples() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let mut lb = Observer::start("libbpf", &p, "5s", &["--raw"]);
    let mut ay = Observer::start("aya", &p, "5s", &["--raw"]);
    lb.wait_attached("libbpf");
    ay.wait_attached("aya");
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cli.pause();
    std::thread::sleep(Duration::from_millis(100));
    let transactions = u64::from(cli.transactions.load(Ordering::Relaxed));
    let lb_lines = lb.finish("libbpf");
    let ay_lines = ay.finish("aya");
    let local = cli.local.to_string();
    let srv = server_addr().to_string();
    assert!(
        transactions > 100,
        "too little traffic: {transactions} transactions"
    );
    for (ns, addr, side) in [(&p.a.name, &local, "client"), (&p.b.name, &srv, "server")] {
        let (n_l, h_l) = flow_hist(&lb_lines, ns, addr, "libbpf");
        let (n_a, h_a) = flow_hist(&ay_lines, ns, addr, "aya");
        let d = hist_distance(&h_l, &h_a);
        eprintln!(
            "{side}: transactions {transactions}, samples libbpf {n_l} aya {n_a}, histogram distance {d}"
        );
        assert!(
            n_l.abs_diff(n_a) <= 2,
            "{side}: sample counts differ: libbpf {n_l}, aya {n_a}"
        );
        assert!(
            d <= 4,
            "{side}: histograms differ by {d} samples: libbpf {h_l:?} aya {h_a:?}"
        );
        // The raw stream (ring buffer through AsyncFd) carries every sample.
        for (loader, lines, n) in [("libbpf", &lb_lines, n_l), ("aya", &ay_lines, n_a)] {
            let raw = raw_samples(lines, ns, addr);
            assert_eq!(
                raw, n,
                "{loader} {side}: {raw} raw samples, {n} in the histogram"
            );
        }
        // One RTT sample per transaction on each end (request acked by the
        // response; response acked by the next request or a delayed ACK).
        let lo = transactions * 9 / 10;
        let hi = transactions * 11 / 10 + 3;
        assert!(
            (lo..=hi).contains(&n_a),
            "{side}: {n_a} samples for {transactions} transactions (expected {lo}..={hi})"
        );
    }
}

/// The same workload under each loader in turn: per-transaction sample
/// rate and median RTT agree within run-to-run noise.
#[test]
fn each_loader_alone_measures_the_same_workload() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let mut results = Vec::new();
    for loader in ["libbpf", "aya"] {
        let mut obs = Observer::start(loader, &p, "3s", &[]);
        obs.wait_attached(loader);
        let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        cli.pause();
        std::thread::sleep(Duration::from_millis(100));
        let transactions = u64::from(cli.transactions.load(Ordering::Relaxed));
        let lines = obs.finish(loader);
        let local = cli.local.to_string();
        let (n, _) = flow_hist(&lines, &p.a.name, &local, loader);
        let med = p50(&lines, &p.a.name, &local);
        eprintln!("{loader}: {transactions} transactions, {n} client samples, p50 {med} us");
        assert!(transactions > 100, "{loader}: too little traffic");
        let rate = n as f64 / transactions as f64;
        assert!(
            (0.9..=1.1).contains(&rate),
            "{loader}: {n} samples for {transactions} transactions"
        );
        results.push((loader, rate, med));
        drop(cli);
    }
    let (l, a) = (&results[0], &results[1]);
    assert!(
        (l.1 - a.1).abs() <= 0.1,
        "samples per transaction: libbpf {:.3}, aya {:.3}",
        l.1,
        a.1
    );
    // Veth RTTs are tens of microseconds and scheduling noise on a shared
    // machine is of the same order: medians agree within 2x or 50 us.
    let (m1, m2) = (l.2.min(a.2), l.2.max(a.2));
    assert!(
        m2 <= 2.0 * m1 || m2 - m1 <= 50.0,
        "median RTT: libbpf {} us, aya {} us",
        l.2,
        a.2
    );
}

/// Largest gap between the two histograms' cumulative distributions (0..1).
fn cdf_gap(a: &[(f64, u64)], b: &[(f64, u64)]) -> f64 {
    let mut m: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
    for (lo, c) in a {
        m.entry(*lo as u64).or_default().0 += c;
    }
    for (lo, c) in b {
        m.entry(*lo as u64).or_default().1 += c;
    }
    let na = a.iter().map(|x| x.1).sum::<u64>().max(1) as f64;
    let nb = b.iter().map(|x| x.1).sum::<u64>().max(1) as f64;
    let (mut ca, mut cb, mut gap) = (0u64, 0u64, 0f64);
    for (x, y) in m.values() {
        ca += x;
        cb += y;
        gap = gap.max((ca as f64 / na - cb as f64 / nb).abs());
    }
    gap
}

/// (n, p50 us, sparse histogram) of a flow's sampler stats in the end line.
fn sampler_stats(
    lines: &[serde_json::Value],
    ns: &str,
    local: &str,
    what: &str,
) -> (u64, f64, Vec<(f64, u64)>) {
    let f = end_flow(lines, ns, local)
        .unwrap_or_else(|| panic!("{what}: flow {local} in {ns} not in the end line: {lines:#?}"));
    let s = &f["sampler"];
    let n = s["summary"]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: no sampler stats for {local} in {ns}: {f}"));
    let p50 = s["summary"]["p50_us"].as_f64().unwrap_or(f64::NAN);
    let h = s["histogram"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| (b[0].as_f64().unwrap(), b[2].as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    (n, p50, h)
}

/// The sampler view under both loaders at once on the same veth pair (each
/// observer has its own tcx links and maps, both see every packet): per flow
/// end, the same sample count and histogram (sampling 1/1 is deterministic),
/// one sample per transaction, and the aya copy per interface really shares
/// its maps (flows from both namespaces in one table, attached through tcx).
#[test]
fn both_loaders_sample_the_same_packets() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let ib = format!("{}:{}", p.b.name, p.b_if);
    let extra = ["--view", "sampler", "--iface", &ia, "--iface", &ib, "--raw"];
    let mut lb = Observer::start("libbpf", &p, "4s", &extra);
    let mut ay = Observer::start("aya", &p, "4s", &extra);
    lb.wait_attached("libbpf");
    ay.wait_attached("aya");
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cli.pause();
    std::thread::sleep(Duration::from_millis(100));
    let transactions = u64::from(cli.transactions.load(Ordering::Relaxed));
    let lb_lines = lb.finish("libbpf");
    let ay_lines = ay.finish("aya");
    assert!(
        transactions > 100,
        "too little traffic: {transactions} transactions"
    );
    let start = &ay_lines[0];
    let how: Vec<_> = start["sampler"]["attached"]
        .as_array()
        .unwrap_or_else(|| panic!("aya: no sampler attach info: {start}"))
        .iter()
        .map(|a| a["how"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(how, ["tcx", "tcx"], "aya: {start}");
    let local = cli.local.to_string();
    let srv = server_addr().to_string();
    let mut totals = [0u64; 2];
    for (ns, addr, side) in [(&p.a.name, &local, "client"), (&p.b.name, &srv, "server")] {
        let (n_l, m_l, h_l) = sampler_stats(&lb_lines, ns, addr, "libbpf");
        let (n_a, m_a, h_a) = sampler_stats(&ay_lines, ns, addr, "aya");
        let d = hist_distance(&h_l, &h_a);
        totals[0] += n_l;
        totals[1] += n_a;
        eprintln!(
            "{side}: transactions {transactions}, sampler samples libbpf {n_l} aya {n_a}, p50 libbpf {m_l:.1} us aya {m_a:.1} us, histogram distance {d}, CDF gap {:.3}",
            cdf_gap(&h_l, &h_a)
        );
        assert!(
            n_l.abs_diff(n_a) <= 3,
            "{side}: sampler sample counts differ: libbpf {n_l}, aya {n_a}"
        );
        // Both programs see the same packets but take their own timestamps,
        // one tcx link after the other on each hook: the second-attached
        // program's RTT carries the difference between the first program's
        // cost at ingress (histogram update, ring buffer) and at egress
        // (pending slot), measured 0-2 us at ~27 us with 1-2 us wide
        // buckets, so the histograms are not compared bucket by bucket
        // (printed above); the sample counts (exact) and medians are.
        let (m1, m2) = (m_l.min(m_a), m_l.max(m_a));
        assert!(
            m2 <= 1.15 * m1 + 3.0,
            "{side}: sampler p50 libbpf {m_l} us, aya {m_a} us"
        );
        let lo = transactions * 9 / 10;
        let hi = transactions * 11 / 10 + 3;
        assert!(
            (lo..=hi).contains(&n_a),
            "{side}: aya sampler {n_a} samples for {transactions} transactions (expected {lo}..={hi})"
        );
    }
    // The raw stream (ring buffer) carries every sample of both flow ends.
    for (loader, lines, n) in [
        ("libbpf", &lb_lines, totals[0]),
        ("aya", &ay_lines, totals[1]),
    ] {
        let raw = lines
            .iter()
            .filter(|l| l["type"] == "sample" && l["view"] == "sampler")
            .count() as u64;
        assert_eq!(
            raw, n,
            "{loader}: {raw} raw sampler samples, {n} in the two flow ends' histograms"
        );
    }
}

/// Asking for a loader the binary lacks, or a bogus one: one sentence, exit 1.
#[test]
fn unknown_loader_is_rejected() {
    let out = Command::new(rttscope_bin())
        .args(["observe", "--loader", "bcc", "--duration", "1s"])
        .env_remove("RTTSCOPE_LOADER")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bcc") && err.contains("libbpf"), "{err}");
}
