//! Privileged end-to-end tests of the sampler view (bpf/sampler.bpf.c):
//! real tc programs on the veth pair of two namespaces this test creates,
//! real TCP request/response flows, checked against `ss -ti` (TCP's own
//! RTT), the think time the client applies, and packets the test crafts.
//!
//! The sampler runs as `rttscope sample --json` (hidden command) in a child
//! process, so crash and cleanup behaviour is the real one.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rttscope_e2e::{
    require_root, rttscope_bin, ss_minrtt_ms, ss_rtt_ms, ChildGuard, NetNs, Pair, RrClient,
    RrServer, A_ADDR, A_ADDR6, B_ADDR, B_ADDR6,
};
use serde_json::Value;

/// A running `rttscope sample --json`.
struct Sampler {
    child: ChildGuard,
    lines: Receiver<String>,
    start: Value,
}

impl Sampler {
    fn start(args: &[&str]) -> Sampler {
        let mut cmd = std::process::Command::new(rttscope_bin());
        cmd.arg("sample").arg("--json").args(args);
        let mut child = ChildGuard::spawn(&mut cmd).expect("spawn rttscope sample");
        let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let out = child.wait_output(Duration::from_secs(1));
                panic!("sampler did not start: {out:?}");
            }
        };
        let start: Value = serde_json::from_str(&first).expect("start line is JSON");
        assert_eq!(start["type"], "sampler_start", "{first}");
        Sampler {
            child,
            lines: rx,
            start,
        }
    }

    /// Wait for the final report (the sampler ends by itself: --duration).
    fn finish(self, timeout: Duration) -> Value {
        self.finish_raw(timeout).0
    }

    /// The final report and the raw samples (--raw) printed before it.
    fn finish_raw(self, timeout: Duration) -> (Value, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        let mut raw = Vec::new();
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => {
                    let v: Value = serde_json::from_str(&l).expect("report line is JSON");
                    if v["type"] == "sampler_sample" {
                        raw.push(v["sample"].clone());
                        continue;
                    }
                    if v["type"] == "sampler_report" && v["final"] == true {
                        last = Some(v);
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(_) => break,
            }
        }
        let out = self.child.wait_output(Duration::from_secs(10)).unwrap();
        assert!(
            out.status.success(),
            "sampler failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (last.expect("no final sampler report"), raw)
    }
}

fn flow(report: &Value, local: SocketAddr, remote: SocketAddr) -> Option<&Value> {
    report["flows"].as_array()?.iter().find(|f| {
        f["local"].as_str() == Some(&local.to_string())
            && f["remote"].as_str() == Some(&remote.to_string())
    })
}

fn counter(report: &Value, name: &str) -> u64 {
    report["counters"][name].as_u64().unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    assert!(!v.is_empty(), "no values");
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Poll `ss -ti` for the srtt (ms) of the socket on `lport` until `stop`.
fn ss_poller(ns: &NetNs, lport: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<f64>> {
    let name = ns.name.clone();
    std::thread::spawn(move || {
        let ns = NetNs { name };
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(Some(v)) = ss_rtt_ms(&ns, lport) {
                out.push(v);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::mem::forget(ns); // the guard belongs to the Pair
        out
    })
}

fn iface(ns: &NetNs, name: &str) -> String {
    format!("{}:{}", ns.name, name)
}

#[test]
fn steady_rr_client_side_matches_tcp() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5001").parse().unwrap();
    let server6: SocketAddr = format!("[{B_ADDR6}]:5001").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let _s6 = RrServer::start(&pair.b, server6, 1).unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.a, &pair.a_if),
        "--duration",
        "4s",
        "--interval",
        "1s",
    ]);
    assert_eq!(sampler.start["settings"]["sample_every"], 1);
    assert_eq!(sampler.start["settings"]["match"], "seq");
    let client = RrClient::start(&pair.a, server, 1, Duration::from_millis(1)).unwrap();
    let client6 = RrClient::start(&pair.a, server6, 1, Duration::from_millis(1)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let poll = ss_poller(&pair.a, client.local.port(), stop.clone());
    std::thread::sleep(Duration::from_millis(3000));
    stop.store(true, Ordering::Relaxed);
    let mut ss = poll.join().unwrap();
    let minrtt_ms = ss_minrtt_ms(&pair.a, client.local.port())
        .unwrap()
        .expect("ss shows the client's minrtt");
    let tr = client.transactions.load(Ordering::Relaxed);
    let (local, local6) = (client.local, client6.local);
    drop(client);
    drop(client6);
    let report = sampler.finish(Duration::from_secs(20));

    let f = flow(&report, local, server).unwrap_or_else(|| panic!("no flow: {report}"));
    let n = f["samples"].as_u64().unwrap();
    let p50_ms = f["p50_us"].as_f64().unwrap() / 1000.0;
    let ss_ms = median(&mut ss);
    eprintln!(
        "steady RR: {tr} transactions, sampler n={n} p50={p50_ms:.3} ms, ss srtt median {ss_ms:.3} ms ({} readings), ss minrtt {minrtt_ms:.3} ms",
        ss.len()
    );
    assert!(n >= 200, "too few sampler samples: {n}; {report}");
    // Expectation: the sampler's median lies between TCP's minimum RTT and
    // its smoothed RTT, each with 20% + 10 us of slack. The sampler times a
    // segment from TCP's own departure stamp but its ACK at tc ingress, below
    // IP and TCP, so it does not see the receive-side stack traversal TCP's
    // samples include (the seed: the cloud sampler excludes the time spent in
    // the VM), a few us of a ~20-40 us veth RTT; and srtt is a moving average,
    // pulled up by the occasional slow round trip a median ignores (on a
    // busy 2-CPU machine it read 1.5-2x the sampler's median). The median
    // against the TCP view's median (issue #3's check) is in observe_views.rs.
    let (lo, hi) = (0.8 * minrtt_ms - 0.010, 1.2 * ss_ms.max(minrtt_ms) + 0.010);
    assert!(
        (lo..=hi).contains(&p50_ms),
        "sampler p50 {p50_ms:.3} ms outside [{lo:.3}, {hi:.3}] ms (TCP minrtt {minrtt_ms:.3}, srtt median {ss_ms:.3}, -20%/+20% and 10 us)"
    );
    // IPv6 flow seen too
    let f6 = flow(&report, local6, server6).unwrap_or_else(|| panic!("no v6 flow: {report}"));
    assert!(f6["samples"].as_u64().unwrap() >= 50, "{f6}");
    assert_eq!(counter(&report, "skip_malformed"), 0);
    // Segments a local TCP socket sent are timed by TCP's own departure
    // time (skb->tstamp), never by a clock read.
    assert!(counter(&report, "recorded") >= 200, "{report}");
    assert_eq!(
        counter(&report, "send_time_clock"),
        0,
        "local TCP segments timed by the clock: {report}"
    );
}

#[test]
fn server_side_sees_client_pause() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5002").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 2).unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.b, &pair.b_if),
        "--duration",
        "4s",
        "--raw",
    ]);
    assert_eq!(sampler.start["settings"]["raw"], true);
    let client = RrClient::start(&pair.a, server, 2, Duration::from_millis(20)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let poll = ss_poller(&pair.b, 5002, stop.clone());
    std::thread::sleep(Duration::from_millis(3200));
    stop.store(true, Ordering::Relaxed);
    let mut ss = poll.join().unwrap();
    let local = client.local;
    drop(client);
    let (report, raw) = sampler.finish_raw(Duration::from_secs(20));
    // the raw stream carries every sample of the histograms
    assert_eq!(
        raw.len() as u64,
        counter(&report, "samples"),
        "{}",
        report["counters"]
    );
    assert_eq!(
        counter(&report, "raw_drops") + counter(&report, "raw_user_drops"),
        0
    );
    let raw_here: Vec<f64> = raw
        .iter()
        .filter(|r| r["flow"]["local"].as_str() == Some(&server.to_string()))
        .map(|r| r["rtt_us"].as_f64().unwrap() / 1000.0)
        .collect();
    // the server is the data sender of the responses
    let f = flow(&report, server, local).unwrap_or_else(|| panic!("no server flow: {report}"));
    let n = f["samples"].as_u64().unwrap();
    let p50_ms = f["p50_us"].as_f64().unwrap() / 1000.0;
    let ss_ms = median(&mut ss);
    eprintln!(
        "20 ms pause: server-side sampler n={n} p50={p50_ms:.2} ms; TCP srtt median {ss_ms:.2} ms"
    );
    assert!(n >= 50, "too few samples: {report}");
    assert_eq!(raw_here.len() as u64, n, "raw samples of the server flow");
    let raw_p50 = median(&mut raw_here.clone());
    assert!(
        (raw_p50 - p50_ms).abs() <= 0.125 * p50_ms,
        "raw median {raw_p50:.2} ms vs histogram p50 {p50_ms:.2} ms (bucket width 12.5%)"
    );
    assert!(
        (18.0..=30.0).contains(&p50_ms),
        "server-side sampler p50 {p50_ms:.2} ms is not the 20 ms pause"
    );
    assert!(
        (p50_ms - ss_ms).abs() <= 0.2 * ss_ms,
        "sampler p50 {p50_ms:.2} ms vs TCP srtt {ss_ms:.2} ms"
    );
}

/// Beyond the delayed-ACK timer with 1-in-4 sampling, the sampler often
/// misses the bare ACK of a response and pairs it with the client's next
/// request instead: the seed's "application-level response time". TCP,
/// which sees every ACK, does not measure the pause.
///
/// Expectation (per response recorded, each client packet sampled with
/// p = 1/4): the bare ACK (<= 40 ms) pairs with p = 1/4; the next request
/// (~think time after the response) with p = 3/4 * 1/4 = 19%; later packets
/// give multiples of the think time. So at least ~half the samples should be
/// >= 0.9 x think time and some should sit at the think time itself.
#[test]
fn long_pause_sampled_measures_think_time() {
    if !require_root() {
        return;
    }
    let think = Duration::from_millis(120);
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 2).unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.b, &pair.b_if),
        "--sample-every",
        "4",
        "--duration",
        "6s",
        "--interval",
        "6s",
    ]);
    assert_eq!(sampler.start["settings"]["sample_every"], 4);
    let clients: Vec<RrClient> = (0..6)
        .map(|_| RrClient::start(&pair.a, server, 2, think).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let poll = ss_poller(&pair.b, 5003, stop.clone());
    std::thread::sleep(Duration::from_millis(5000));
    stop.store(true, Ordering::Relaxed);
    let mut ss = poll.join().unwrap();
    drop(clients);
    let report = sampler.finish(Duration::from_secs(20));
    let think_us = think.as_micros() as f64;
    let (mut total, mut at_least, mut at_think) = (0u64, 0u64, 0u64);
    for f in report["flows"].as_array().unwrap() {
        if f["local"].as_str() != Some(&server.to_string()) {
            continue;
        }
        for b in f["hist"].as_array().unwrap() {
            let lo = b[0].as_f64().unwrap();
            let hi = b[1].as_f64().unwrap_or(f64::INFINITY);
            let c = b[2].as_u64().unwrap();
            total += c;
            if lo >= 0.9 * think_us {
                at_least += c;
            }
            if lo >= 0.9 * think_us && hi <= 1.4 * think_us {
                at_think += c;
            }
        }
    }
    let ss_ms = median(&mut ss);
    eprintln!(
        "long pause {think:?}, 1 in 4: {total} samples, {at_least} >= 0.9 x think, {at_think} at the think time; TCP srtt median {ss_ms:.2} ms; counters {}",
        report["counters"]
    );
    assert!(total >= 15, "too few samples: {report}");
    assert!(
        at_think >= 2,
        "expected some samples at the think time: {report}"
    );
    assert!(
        at_least as f64 >= 0.4 * total as f64,
        "expected most samples to include the pause, got {at_least} of {total}"
    );
    assert!(
        ss_ms < 0.6 * think.as_secs_f64() * 1000.0,
        "TCP's srtt {ss_ms:.2} ms should not include the pause (seed: TCP sees the bare ACKs)"
    );
}

/// A flow table far smaller than the number of flows (16 entries: 4 sets of
/// 4 ways, 40 connections): new flows evict the least recently used way of
/// their set, every eviction is counted, live entries never exceed the
/// table, samples keep coming, and no sample is bogus (a way re-keyed under
/// a segment or an ACK of its previous flow).
#[test]
fn small_flow_table_evicts_and_counts() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5011").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.a, &pair.a_if),
        "--max-flows",
        "10",
        "--max-pending",
        "1",
        "--duration",
        "4s",
        "--interval",
        "4s",
    ]);
    assert_eq!(sampler.start["settings"]["table_entries"], 16);
    let clients: Vec<RrClient> = (0..40)
        .map(|_| RrClient::start(&pair.a, server, 1, Duration::from_millis(2)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(3000));
    let transactions: u64 = clients
        .iter()
        .map(|c| u64::from(c.transactions.load(Ordering::Relaxed)))
        .sum();
    drop(clients);
    let report = sampler.finish(Duration::from_secs(20));
    let c = |n: &str| counter(&report, n);
    eprintln!(
        "small table: {transactions} transactions, {} flows reported, counters {}",
        report["flows"].as_array().map_or(0, |f| f.len()),
        report["counters"]
    );
    assert!(c("pending_evicted") > 0, "no eviction: {report}");
    assert!(c("evicted_segments") <= 8 * c("pending_evicted"));
    assert!(c("flows_evicted") <= c("pending_evicted"));
    assert_eq!(
        c("pending_live"),
        c("pending_created") - c("pending_evicted")
    );
    assert!(c("pending_live") <= 16, "{report}");
    assert!(c("flows_live") <= 16, "{report}");
    assert!(c("samples") > 100, "too few samples: {report}");
    let flows = report["flows"].as_array().unwrap();
    assert!(!flows.is_empty() && flows.len() <= 16, "{report}");
    let reported: u64 = flows.iter().map(|f| f["samples"].as_u64().unwrap()).sum();
    assert!(reported <= c("samples"), "{reported} > {}", c("samples"));
    for f in flows {
        // a bogus sample would time a segment of another flow: any value
        // up to the 10 s timeout; real ones here are a few ms at most
        let max = f["max_us"].as_f64().unwrap();
        assert!(max < 500_000.0, "implausible sample {max} us: {f}");
        assert_eq!(f["remote"], server.to_string(), "{f}");
    }
}

#[test]
fn tsval_matching_agrees_with_seq() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5004").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let ifa = iface(&pair.a, &pair.a_if);
    let seq = Sampler::start(&["--iface", &ifa, "--duration", "4s", "--match", "seq"]);
    let ts = Sampler::start(&["--iface", &ifa, "--duration", "4s", "--match", "tsval"]);
    assert_eq!(ts.start["settings"]["match"], "tsval");
    // 2 ms between requests: every request has a fresh TSval (1 ms clock)
    let client = RrClient::start(&pair.a, server, 1, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    let local = client.local;
    drop(client);
    let rs = seq.finish(Duration::from_secs(20));
    let rt = ts.finish(Duration::from_secs(20));
    let fs = flow(&rs, local, server).unwrap_or_else(|| panic!("seq: {rs}"));
    let ft = flow(&rt, local, server).unwrap_or_else(|| panic!("tsval: {rt}"));
    let (ps, pt) = (
        fs["p50_us"].as_f64().unwrap(),
        ft["p50_us"].as_f64().unwrap(),
    );
    let (ns, nt) = (
        fs["samples"].as_u64().unwrap(),
        ft["samples"].as_u64().unwrap(),
    );
    eprintln!("seq n={ns} p50={ps:.0} us; tsval n={nt} p50={pt:.0} us");
    assert!(
        ns >= 100 && nt >= 100,
        "too few samples: seq {ns}, tsval {nt}"
    );
    assert!(
        (pt - ps).abs() <= 0.2 * ps,
        "tsval p50 {pt:.0} us vs seq p50 {ps:.0} us: more than 20% apart"
    );
    assert_eq!(counter(&rt, "no_timestamp"), 0, "timestamps are on: {rt}");
}

/// A router namespace between two hosts: the sampler on the router's
/// interface toward the server sees forwarded traffic only (no local socket).
/// tsval and seq matching both pair the client's data with the server's
/// ACKs there; their medians agree within 20%.
#[test]
fn forwarded_traffic_is_sampled_on_a_router() {
    if !require_root() {
        return;
    }
    use rttscope_e2e::{sh, unique};
    let c = NetNs::new("rtsc").unwrap();
    let r = NetNs::new("rtsr").unwrap();
    let s = NetNs::new("rtss").unwrap();
    let (c_if, rc_if, rs_if, s_if) = (unique("vc"), unique("vrc"), unique("vrs"), unique("vs"));
    sh(&[
        "ip", "link", "add", &c_if, "netns", &c.name, "type", "veth", "peer", "name", &rc_if,
        "netns", &r.name,
    ])
    .unwrap();
    sh(&[
        "ip", "link", "add", &rs_if, "netns", &r.name, "type", "veth", "peer", "name", &s_if,
        "netns", &s.name,
    ])
    .unwrap();
    for (ns, ifn, addr) in [
        (&c, &c_if, "10.78.1.2/24"),
        (&r, &rc_if, "10.78.1.1/24"),
        (&r, &rs_if, "10.78.2.1/24"),
        (&s, &s_if, "10.78.2.2/24"),
    ] {
        ns.exec(&["ip", "addr", "add", addr, "dev", ifn]).unwrap();
        ns.exec(&["ip", "link", "set", ifn, "up"]).unwrap();
    }
    c.exec(&["ip", "route", "add", "default", "via", "10.78.1.1"])
        .unwrap();
    s.exec(&["ip", "route", "add", "default", "via", "10.78.2.1"])
        .unwrap();
    r.exec(&["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        .unwrap();
    let server: SocketAddr = "10.78.2.2:5006".parse().unwrap();
    let _srv = RrServer::start(&s, server, 1).unwrap();
    let ifr = iface(&r, &rs_if);
    let seq = Sampler::start(&["--iface", &ifr, "--duration", "4s", "--match", "seq"]);
    let ts = Sampler::start(&["--iface", &ifr, "--duration", "4s", "--match", "tsval"]);
    let client = RrClient::start(&c, server, 1, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    let local = client.local;
    drop(client);
    let (rs, rt) = (
        seq.finish(Duration::from_secs(20)),
        ts.finish(Duration::from_secs(20)),
    );
    // the data sender is the client; the router's namespace is the key's
    let fs = flow(&rs, local, server).unwrap_or_else(|| panic!("seq: {rs}"));
    let ft = flow(&rt, local, server).unwrap_or_else(|| panic!("tsval: {rt}"));
    let r_inode = rs["attach"][0]["netns_inode"].as_u64().unwrap();
    assert_eq!(fs["netns"].as_u64().unwrap(), r_inode);
    let (ps, pt) = (
        fs["p50_us"].as_f64().unwrap(),
        ft["p50_us"].as_f64().unwrap(),
    );
    let (ns_, nt) = (
        fs["samples"].as_u64().unwrap(),
        ft["samples"].as_u64().unwrap(),
    );
    eprintln!("forwarded: seq n={ns_} p50={ps:.0} us; tsval n={nt} p50={pt:.0} us");
    // Forwarded segments carry no departure time of this host's TCP: every
    // recorded one was timed by the clock.
    for r in [&rs, &rt] {
        let (rec, clock) = (counter(r, "recorded"), counter(r, "send_time_clock"));
        assert!(
            rec > 0 && clock >= rec,
            "forwarded: {rec} recorded, {clock} timed by the clock: {r}"
        );
    }
    assert!(
        ns_ >= 100 && nt >= 100,
        "too few samples: seq {ns_}, tsval {nt}"
    );
    assert!(
        (pt - ps).abs() <= 0.2 * ps,
        "tsval {pt:.0} us vs seq {ps:.0} us"
    );
}

/// Bulk transfer: on veth, egress skbs carry many segments (GSO: the test
/// checks there are far fewer egress skbs than segments). The end sequence
/// comes from the payload length, so the ACK of an skb's last byte times it.
/// Expectation: samples are produced, and never exceed TCP's own RTT (the
/// sampler times the data from TCP's own departure stamp and sees the ACK
/// before TCP processes it; a too-large end sequence would push samples to later ACKs
/// and above TCP's). They are often far below it: while the sender is inside
/// sendmsg() holding the socket lock, ACKs wait in the socket backlog, and
/// TCP's samples include that wait (measured: sampler p50 45 us, TCP srtt
/// 356 us). On veth a GSO skb crosses intact, so a too-small end sequence
/// would not show here; the crafted-packet test covers the arithmetic.
#[test]
fn bulk_flow_with_segmentation_offload() {
    if !require_root() {
        return;
    }
    use std::io::{Read, Write};
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5007").parse().unwrap();
    let (tx, rx) = channel();
    let sink = pair.b.spawn(move || {
        let l = std::net::TcpListener::bind(server).unwrap();
        tx.send(()).unwrap();
        let (mut c, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let sampler = Sampler::start(&["--iface", &iface(&pair.a, &pair.a_if), "--duration", "3s"]);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let (ltx, lrx) = channel();
    let sender = pair.a.spawn(move || {
        let mut c = std::net::TcpStream::connect(server).unwrap();
        ltx.send(c.local_addr().unwrap()).unwrap();
        let buf = vec![7u8; 1 << 16];
        while !stop2.load(Ordering::Relaxed) {
            if c.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let local = lrx.recv_timeout(Duration::from_secs(5)).unwrap();
    let stop3 = Arc::new(AtomicBool::new(false));
    let poll = ss_poller(&pair.a, local.port(), stop3.clone());
    std::thread::sleep(Duration::from_millis(2000));
    stop3.store(true, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let mut ss = poll.join().unwrap();
    sender.join().unwrap();
    let bytes = sink.join().unwrap();
    let report = sampler.finish(Duration::from_secs(20));
    let f = flow(&report, local, server).unwrap_or_else(|| panic!("no flow: {report}"));
    let (n, p50) = (
        f["samples"].as_u64().unwrap(),
        f["p50_us"].as_f64().unwrap(),
    );
    let ss_us = median(&mut ss) * 1000.0;
    let skbs = counter(&report, "tcp_egress");
    let segments = bytes / 1448;
    eprintln!(
        "bulk: {bytes} bytes (~{segments} segments) in {skbs} egress skbs; sampler n={n} p50={p50:.0} us; TCP srtt median {ss_us:.0} us; counters {}",
        report["counters"]
    );
    assert!(n >= 100, "too few samples: {report}");
    assert!(
        skbs * 2 < segments,
        "expected GSO skbs: {skbs} skbs for {segments} segments"
    );
    assert!(
        p50 <= 1.5 * ss_us,
        "bulk sampler p50 {p50:.0} us above TCP srtt {ss_us:.0} us"
    );
}

// ---- crafted packets -------------------------------------------------------

const PEER: [u8; 4] = [10, 77, 0, 99]; // nobody: b does not forward, a drops it (nft)

fn csum(data: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in data.chunks(2) {
        s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

#[derive(Clone, Copy)]
struct Tcp {
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: usize,
}

/// Ethernet + IPv4 + TCP. `ihl_extra` adds IP option words, `frag` sets MF.
fn frame(t: Tcp, ihl_extra: usize, frag: bool, doff: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 1]);
    f.extend([0x08, 0x00]);
    let ihl = 5 + ihl_extra;
    let tcp_len = 20 + t.payload;
    let tot = ihl * 4 + tcp_len;
    let mut ip = vec![0x40 | ihl as u8, 0];
    ip.extend((tot as u16).to_be_bytes());
    ip.extend([0, 1]);
    ip.extend(if frag { [0x20, 0] } else { [0x40, 0] });
    ip.extend([64, 6, 0, 0]);
    ip.extend(t.src);
    ip.extend(t.dst);
    ip.extend(std::iter::repeat_n(1u8, ihl_extra * 4)); // NOP options
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend(ip);
    f.extend(t.sport.to_be_bytes());
    f.extend(t.dport.to_be_bytes());
    f.extend(t.seq.to_be_bytes());
    f.extend(t.ack.to_be_bytes());
    f.extend([doff << 4, t.flags]);
    f.extend([0xff, 0xff, 0, 0, 0, 0]);
    f.extend(std::iter::repeat_n(b'x', t.payload));
    f
}

/// Send raw Ethernet frames out of `ifname` in the calling thread's namespace.
fn send_frames(ifname: &str, frames: &[Vec<u8>]) {
    let cname = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: plain socket calls with valid buffers.
    unsafe {
        let idx = libc::if_nametoindex(cname.as_ptr());
        assert!(idx > 0, "no interface {ifname}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = idx as i32;
        sll.sll_halen = 6;
        for fr in frames {
            let r = libc::sendto(
                fd,
                fr.as_ptr().cast(),
                fr.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert!(r >= 0, "sendto: {}", std::io::Error::last_os_error());
        }
        libc::close(fd);
    }
}

/// A data segment is recorded at a's egress; malformed packets that would
/// acknowledge it if mis-parsed arrive at a's ingress and must be skipped
/// and counted; then one well-formed ACK produces exactly one sample.
#[test]
fn garbage_is_counted_and_never_sampled() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    // a must not answer the crafted ACKs with a RST (which clears pending state)
    pair.a
        .exec(&["nft", "add", "table", "inet", "rtsgarbage"])
        .unwrap();
    pair.a
        .exec(&[
            "nft",
            "add chain inet rtsgarbage in { type filter hook input priority 0 ; }",
        ])
        .unwrap();
    pair.a
        .exec(&[
            "nft",
            "add rule inet rtsgarbage in ip saddr 10.77.0.99 drop",
        ])
        .unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.a, &pair.a_if),
        "--duration",
        "3s",
        "--interval",
        "3s",
    ]);
    let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let data = Tcp {
        src: a_ip,
        dst: PEER,
        sport: 41111,
        dport: 42222,
        seq: 1000,
        ack: 0,
        flags: 0x08, // PSH, no ACK
        payload: 10,
    };
    let a_if = pair.a_if.clone();
    pair.a
        .run(move || send_frames(&a_if, &[frame(data, 0, false, 5)]));
    std::thread::sleep(Duration::from_millis(30));

    let ack = Tcp {
        src: PEER,
        dst: a_ip,
        sport: 42222,
        dport: 41111,
        seq: 5000,
        ack: 1010, // covers the data segment's end sequence
        flags: 0x10,
        payload: 0,
    };
    let good = frame(ack, 0, false, 5);
    let mut bad: Vec<Vec<u8>> = vec![
        frame(ack, 1, false, 5),  // IP options
        frame(ack, 0, true, 5),   // fragment
        frame(ack, 0, false, 3),  // TCP data offset < 5
        frame(ack, 0, false, 15), // data offset past the packet
    ];
    let mut trunc = good.clone();
    trunc.truncate(14 + 20 + 10); // TCP header cut short
    bad.push(trunc);
    let mut longer = good.clone();
    longer[16..18].copy_from_slice(&200u16.to_be_bytes()); // IP length beyond the frame
    bad.push(longer);
    let mut v5 = good.clone();
    v5[14] = 0x55; // IP version 5
    bad.push(v5);
    let mut udp = good.clone();
    udp[23] = 17;
    bad.push(udp);
    let mut vlan = good[..12].to_vec(); // 802.1Q tag around the good ACK
    vlan.extend([0x81, 0x00, 0x00, 0x07]);
    vlan.extend(&good[12..]);
    bad.push(vlan);
    bad.push(good[..14].to_vec()); // Ethernet header only: IPv4 header missing
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    bad.push(arp);
    // IPv6 with a fragment header
    let mut v6 = vec![0xff; 6];
    v6.extend([0x02, 0, 0, 0, 0, 1, 0x86, 0xdd]);
    v6.extend([0x60, 0, 0, 0, 0, 28, 44, 64]);
    v6.extend(B_ADDR6.parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend(A_ADDR6.parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend([6, 0, 0, 1, 0, 0, 0, 1]);
    v6.extend(&good[34..54]);
    bad.push(v6);

    // well formed, but one byte short of the data segment's end: covers nothing
    let partial = frame(Tcp { ack: 1009, ..ack }, 0, false, 5);
    let b_if = pair.b_if.clone();
    let bad2 = bad.clone();
    pair.b.run(move || {
        send_frames(&b_if, &bad2);
        send_frames(&b_if, &[partial]);
    });
    std::thread::sleep(Duration::from_millis(200));
    let b_if = pair.b_if.clone();
    pair.b.run(move || send_frames(&b_if, &[good]));
    let report = sampler.finish(Duration::from_secs(20));
    eprintln!("garbage: counters {}", report["counters"]);
    let c = |n| counter(&report, n);
    assert_eq!(c("recorded"), 1, "the crafted data segment is recorded");
    for name in [
        "skip_ip_options",
        "skip_fragment",
        "skip_malformed",
        "skip_truncated",
        "skip_vlan",
        "skip_non_tcp",
        "skip_non_ip",
        "skip_ipv6_ext",
    ] {
        assert!(c(name) >= 1, "{name} not counted: {}", report["counters"]);
    }
    assert_eq!(c("ack_no_match"), 1, "the partial ACK covers nothing");
    // no bogus sample from the garbage; the one good ACK gives exactly one
    assert_eq!(c("samples"), 1, "{}", report["counters"]);
    let flows = report["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1, "{report}");
    let rtt = flows[0]["max_us"].as_f64().unwrap();
    assert!(
        (200_000.0..5_000_000.0).contains(&rtt),
        "the sample spans the 30+200 ms the test waited: {rtt} us"
    );
    assert_eq!(flows[0]["remote"], "10.77.0.99:42222");
}

/// `rttscope observe --view sampler --format json` until it ends by itself
/// (`--duration`): its start line is read before this returns (programs
/// attached); `finish` returns the `end` line.
struct Observed {
    child: ChildGuard,
    lines: Receiver<String>,
}

impl Observed {
    fn start(iface: &str, duration: &str) -> Observed {
        let mut cmd = std::process::Command::new(rttscope_bin());
        cmd.args(["observe", "--view", "sampler", "--iface", iface])
            .args(["--format", "json", "--duration", duration])
            .args(["--interval", duration]);
        let mut child = ChildGuard::spawn(&mut cmd).expect("spawn rttscope observe");
        let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => {
                let v: Value = serde_json::from_str(&l).expect("start line is JSON");
                assert_eq!(v["type"], "start", "{l}");
            }
            Err(_) => {
                let out = child.wait_output(Duration::from_secs(1));
                panic!("observe did not start: {out:?}");
            }
        }
        Observed { child, lines: rx }
    }

    fn finish(self, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        let mut end = None;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => {
                    let v: Value = serde_json::from_str(&l).expect("observe line is JSON");
                    if v["type"] == "end" {
                        end = Some(v);
                        break;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(_) => break,
            }
        }
        let out = self.child.wait_output(Duration::from_secs(10)).unwrap();
        assert!(
            out.status.success(),
            "observe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        end.expect("no end line from observe")
    }
}

/// Issue 18 item 8: an ACK whose IPv4 total length is 0 on a 54-byte frame
/// that is no GSO/BIG TCP packet was parsed with its length taken from the
/// skb, and timed the recorded segment (a 250 ms sample, `skip_malformed`
/// 0). The kernel drops such a packet; the sampler must count it as
/// malformed and take no sample. The same for IPv6 payload length 0. A good
/// ACK sent afterwards shows the segment was still pending (the malformed
/// one would have matched it).
#[test]
fn zero_ip_length_without_gso_is_malformed() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    // a must not answer the crafted ACKs with a RST (which clears pending state)
    pair.a
        .exec(&["nft", "add", "table", "inet", "rtszerolen"])
        .unwrap();
    pair.a
        .exec(&[
            "nft",
            "add chain inet rtszerolen in { type filter hook input priority 0 ; }",
        ])
        .unwrap();
    pair.a
        .exec(&[
            "nft",
            "add rule inet rtszerolen in ip saddr 10.77.0.99 drop",
        ])
        .unwrap();
    let obs = Observed::start(&iface(&pair.a, &pair.a_if), "3s");
    let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let data = Tcp {
        src: a_ip,
        dst: PEER,
        sport: 41113,
        dport: 42224,
        seq: 1000,
        ack: 0,
        flags: 0x08, // PSH, no ACK
        payload: 10,
    };
    let a_if = pair.a_if.clone();
    pair.a
        .run(move || send_frames(&a_if, &[frame(data, 0, false, 5)]));
    std::thread::sleep(Duration::from_millis(30));

    let ack = Tcp {
        src: PEER,
        dst: a_ip,
        sport: 42224,
        dport: 41113,
        seq: 5000,
        ack: 1010, // covers the data segment's end sequence
        flags: 0x10,
        payload: 0,
    };
    let good = frame(ack, 0, false, 5);
    let mut zero = good.clone();
    assert_eq!(zero.len(), 54);
    zero[16..18].copy_from_slice(&[0, 0]); // IPv4 total length 0
    zero[24..26].copy_from_slice(&[0, 0]);
    let c = csum(&zero[14..34]);
    zero[24..26].copy_from_slice(&c.to_be_bytes());
    // IPv6, payload length 0, next header TCP (no jumbo option, not GSO)
    let mut v6 = vec![0xff; 6];
    v6.extend([0x02, 0, 0, 0, 0, 1, 0x86, 0xdd]);
    v6.extend([0x60, 0, 0, 0, 0, 0, 6, 64]);
    v6.extend(B_ADDR6.parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend(A_ADDR6.parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend(&good[34..54]);
    let b_if = pair.b_if.clone();
    pair.b.run(move || send_frames(&b_if, &[zero, v6]));
    std::thread::sleep(Duration::from_millis(300));
    let b_if = pair.b_if.clone();
    pair.b.run(move || send_frames(&b_if, &[good]));
    let end = obs.finish(Duration::from_secs(20));
    let counters = &end["counters"]["sampler"];
    eprintln!(
        "zero IP length: counters {counters}; flows {}",
        end["flows"]
    );
    let c = |n: &str| counters[n].as_u64().unwrap_or(0);
    assert_eq!(
        c("recorded"),
        1,
        "the crafted data segment is recorded: {counters}"
    );
    assert_eq!(
        c("skip_malformed"),
        2,
        "the IPv4 and IPv6 length-0 frames are malformed: {counters}"
    );
    assert_eq!(
        c("samples"),
        1,
        "only the good ACK gives a sample: {counters}"
    );
    let flows = end["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 1, "{end}");
    let max = flows[0]["sampler"]["summary"]["max_us"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        max >= 300_000.0,
        "the sample spans the 30+300 ms before the good ACK, not the 30 ms before the malformed one: {max} us; {end}"
    );
}

/// Allow IPv4 BIG TCP on `ifname` (calling thread's namespace): set
/// IFLA_GSO_IPV4_MAX_SIZE and IFLA_GRO_IPV4_MAX_SIZE (Linux >= 6.3) through
/// rtnetlink; iproute2 6.1 (Debian 12) has no option for them.
fn set_ipv4_big_tcp(ifname: &str, size: u32) {
    const IFLA_GSO_IPV4_MAX_SIZE: u16 = 63;
    const IFLA_GRO_IPV4_MAX_SIZE: u16 = 64;
    let cname = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: plain socket calls with valid buffers.
    unsafe {
        let idx = libc::if_nametoindex(cname.as_ptr());
        assert!(idx > 0, "no interface {ifname}");
        let mut msg: Vec<u8> = Vec::new();
        msg.extend(0u32.to_ne_bytes()); // length, below
        msg.extend(libc::RTM_NEWLINK.to_ne_bytes());
        msg.extend(((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
        msg.extend(1u32.to_ne_bytes()); // seq
        msg.extend(0u32.to_ne_bytes()); // pid
                                        // struct ifinfomsg: family, pad, type, index, flags, change
        msg.extend([libc::AF_UNSPEC as u8, 0, 0, 0]);
        msg.extend((idx as i32).to_ne_bytes());
        msg.extend(0u32.to_ne_bytes());
        msg.extend(0u32.to_ne_bytes());
        for attr in [IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE] {
            msg.extend(8u16.to_ne_bytes());
            msg.extend(attr.to_ne_bytes());
            msg.extend(size.to_ne_bytes());
        }
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE);
        assert!(
            fd >= 0,
            "netlink socket: {}",
            std::io::Error::last_os_error()
        );
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        let r = libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        );
        assert!(
            r >= 0,
            "netlink sendto: {}",
            std::io::Error::last_os_error()
        );
        let mut buf = [0u8; 1024];
        let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
        libc::close(fd);
        assert!(n >= 20, "netlink recv: {}", std::io::Error::last_os_error());
        // NLMSG_ERROR with error 0 = ACK
        let err = i32::from_ne_bytes(buf[16..20].try_into().unwrap());
        assert_eq!(
            err,
            0,
            "setting IPv4 BIG TCP sizes on {ifname}: {}",
            std::io::Error::from_raw_os_error(-err)
        );
    }
}

/// The other side of the length-0 rule: real IPv4 BIG TCP packets (GSO skbs
/// over 64 KiB, total length 0) are still parsed, with their length from the
/// skb. veth carries them intact once both ends allow a GSO/GRO size above
/// 64 KiB; an average egress skb above 64 KiB shows they were there.
#[test]
fn big_tcp_packets_are_still_sampled() {
    if !require_root() {
        return;
    }
    use std::io::{Read, Write};
    let pair = Pair::new().unwrap();
    for (ns, dev) in [(&pair.a, &pair.a_if), (&pair.b, &pair.b_if)] {
        ns.exec(&[
            "ip",
            "link",
            "set",
            "dev",
            dev,
            "gso_max_size",
            "185000",
            "gro_max_size",
            "185000",
        ])
        .unwrap();
        let dev = dev.clone();
        ns.run(move || set_ipv4_big_tcp(&dev, 185_000));
    }
    let server: SocketAddr = format!("{B_ADDR}:5008").parse().unwrap();
    let (tx, rx) = channel();
    let sink = pair.b.spawn(move || {
        let l = std::net::TcpListener::bind(server).unwrap();
        tx.send(()).unwrap();
        let (mut c, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 18];
        let mut total = 0u64;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let obs = Observed::start(&iface(&pair.a, &pair.a_if), "3s");
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = pair.a.spawn(move || {
        let mut c = std::net::TcpStream::connect(server).unwrap();
        let buf = vec![7u8; 1 << 20];
        while !stop2.load(Ordering::Relaxed) {
            if c.write_all(&buf).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    let bytes = sink.join().unwrap();
    let end = obs.finish(Duration::from_secs(20));
    let counters = &end["counters"]["sampler"];
    let c = |n: &str| counters[n].as_u64().unwrap_or(0);
    let per_skb = bytes / c("tcp_egress").max(1);
    eprintln!(
        "BIG TCP: {bytes} bytes in {} egress TCP skbs ({per_skb} bytes each); counters {counters}",
        c("tcp_egress")
    );
    assert!(
        per_skb > 65_535,
        "no BIG TCP skbs parsed: {per_skb} bytes per egress skb; {counters}"
    );
    assert_eq!(c("skip_malformed"), 0, "{counters}");
    assert_eq!(c("skip_truncated"), 0, "{counters}");
    assert!(c("samples") >= 20, "too few samples: {counters}");
}

/// clsact fallback: a killed run leaves its filters; the next run removes
/// them at start and its own on exit. tcx: a killed run leaves nothing.
#[test]
fn clsact_cleanup_and_tcx_detach_on_death() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let ifa = iface(&pair.a, &pair.a_if);
    let filters = |dir: &str| -> String {
        let o = pair
            .a
            .exec(&["tc", "filter", "show", "dev", &pair.a_if, dir])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        o
    };
    let qdiscs = || -> String {
        pair.a
            .exec(&["tc", "qdisc", "show", "dev", &pair.a_if])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    // a clean run leaves nothing: no filter, and not the clsact qdisc it created
    let s = Sampler::start(&["--iface", &ifa, "--attach", "clsact", "--duration", "1s"]);
    assert!(qdiscs().contains("clsact"), "{}", qdiscs());
    s.finish(Duration::from_secs(20));
    assert!(
        !qdiscs().contains("clsact"),
        "qdisc left behind: {}",
        qdiscs()
    );
    assert!(!filters("egress").contains("rttscope"));

    let s = Sampler::start(&["--iface", &ifa, "--attach", "clsact", "--duration", "60s"]);
    assert_eq!(s.start["attach"][0]["how"], "clsact", "{}", s.start);
    assert!(
        filters("egress").contains("rttscope_sm_egr"),
        "{}",
        filters("egress")
    );
    assert!(filters("ingress").contains("rttscope_sm_ing"));
    let pid = s.child.pid();
    // SAFETY: kill our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    drop(s);
    assert!(
        filters("egress").contains("rttscope_sm_egr"),
        "legacy filters outlive the process"
    );
    // the next run cleans up at start, works, and removes its own filters on exit
    let server: SocketAddr = format!("{B_ADDR}:5005").parse().unwrap();
    let _srv = RrServer::start(&pair.b, server, 1).unwrap();
    let s = Sampler::start(&["--iface", &ifa, "--attach", "clsact", "--duration", "2s"]);
    let egress_now = filters("egress");
    assert_eq!(
        egress_now.matches("handle 0x7273").count(),
        1,
        "stale filter not replaced: {egress_now}"
    );
    let client = RrClient::start(&pair.a, server, 1, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    drop(client);
    let report = s.finish(Duration::from_secs(20));
    assert!(counter(&report, "samples") > 50, "{}", report["counters"]);
    assert!(
        !filters("egress").contains("rttscope"),
        "{}",
        filters("egress")
    );
    assert!(
        !filters("ingress").contains("rttscope"),
        "{}",
        filters("ingress")
    );

    // tcx: kill -9, then the programs must disappear with the links
    let s = Sampler::start(&["--iface", &ifa, "--duration", "60s"]);
    assert_eq!(s.start["attach"][0]["how"], "tcx", "{}", s.start);
    let ids: Vec<u64> = s.start["progs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    // SAFETY: kill our own child.
    unsafe { libc::kill(s.child.pid() as i32, libc::SIGKILL) };
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| {
                std::process::Command::new("bpftool")
                    .args(["prog", "show", "id", &id.to_string()])
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false)
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "programs {alive:?} still loaded after the process died"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_interface_is_one_clear_error() {
    if !require_root() {
        return;
    }
    let out = std::process::Command::new(rttscope_bin())
        .args(["sample", "--iface", "no-such-if0", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("rttscope: "), "{err}");
    assert!(err.contains("no-such-if0"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

// ---- benchmark (ignored; scripts/bench-sampler.sh runs it) -----------------

/// BPF run-time statistics while the returned fd is open (BPF_ENABLE_STATS):
/// nothing global is left changed when the benchmark ends.
fn enable_bpf_stats() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr = [0u32; 4]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
                          // SAFETY: bpf(2) with a zeroed attr of the size we pass.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), 16usize) };
    // SAFETY: a fresh fd we own.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// ns per run of a loaded program on one frame, BPF_PROG_TEST_RUN with
/// `repeat` (time while preempted is excluded by the kernel).
fn test_run_ns(prog_id: u64, frame: &[u8], repeat: u32) -> Option<(f64, i32)> {
    #[repr(C)]
    #[derive(Default)]
    struct GetFd {
        prog_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    #[repr(C)]
    #[derive(Default)]
    struct TestRun {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    let g = GetFd {
        prog_id: prog_id as u32,
        ..Default::default()
    };
    // SAFETY: bpf(2) with attrs of the sizes we pass.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            &g as *const GetFd,
            std::mem::size_of::<GetFd>(),
        );
        if fd < 0 {
            return None;
        }
        let mut t = TestRun {
            prog_fd: fd as u32,
            data_size_in: frame.len() as u32,
            data_in: frame.as_ptr() as u64,
            repeat,
            ..Default::default()
        };
        let r = libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut t as *mut TestRun,
            std::mem::size_of::<TestRun>(),
        );
        libc::close(fd as i32);
        (r == 0).then_some((t.duration as f64, t.retval as i32))
    }
}

fn prog_stats(id: u64) -> (u64, u64) {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "prog", "show", "id", &id.to_string()])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        v["run_time_ns"].as_u64().unwrap_or(0),
        v["run_cnt"].as_u64().unwrap_or(0),
    )
}

fn rr_tps(pair: &Pair, server: SocketAddr, secs: f64) -> f64 {
    let c = RrClient::start(&pair.a, server, 1, Duration::ZERO).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // warm up
    let t0 = Instant::now();
    let n0 = c.transactions.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let n = c.transactions.load(Ordering::Relaxed) - n0;
    let tps = n as f64 / t0.elapsed().as_secs_f64();
    drop(c);
    tps
}

/// ns per packet of each tc program and the transaction-rate drop of a
/// full-speed TCP request/response flow with the sampler on both ends'
/// interfaces at --sample-every 1. Rounds alternate off/on to spread the
/// noise of a shared machine over both.
#[test]
#[ignore]
fn bench_sampler_overhead() {
    if !require_root() {
        return;
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let matching = std::env::var("BENCH_MATCH").unwrap_or_else(|_| "seq".into());
    let every = std::env::var("BENCH_SAMPLE_EVERY").unwrap_or_else(|_| "1".into());
    let _stats = enable_bpf_stats().expect("BPF_ENABLE_STATS");
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5009").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut per_prog: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut test_run: Vec<(String, f64)> = Vec::new();
    // per round: the regime of an idle 2-vCPU VM flips between ~15k and
    // ~50k TPS (CPUs idling between packets or not), and ns/packet with it:
    // compare rounds of similar TPS
    let mut per_round: Vec<serde_json::Value> = Vec::new();
    for round in 0..rounds {
        off.push(rr_tps(&pair, server, secs));
        let s = Sampler::start(&[
            "--iface",
            &iface(&pair.a, &pair.a_if),
            "--iface",
            &iface(&pair.b, &pair.b_if),
            "--match",
            &matching,
            "--sample-every",
            &every,
            "--duration",
            "600s",
            "--interval",
            "600s",
        ]);
        on.push(rr_tps(&pair, server, secs));
        let mut this_round: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for p in s.start["progs"].as_array().unwrap() {
            let (ns, cnt) = prog_stats(p["id"].as_u64().unwrap());
            let name = p["name"].as_str().unwrap().to_string();
            let e = this_round.entry(name.clone()).or_default();
            e.0 += ns;
            e.1 += cnt;
            let e = per_prog.entry(name).or_default();
            e.0 += ns;
            e.1 += cnt;
        }
        let nsp = |n: &str| {
            this_round
                .get(n)
                .map(|(ns, c)| *ns as f64 / (*c).max(1) as f64)
                .unwrap_or(0.0)
        };
        println!(
            "  round {round}: TPS off {:.0} on {:.0}; egr {:.1} ns/packet, ing {:.1} ns/packet",
            off[round],
            on[round],
            nsp("rttscope_sm_egr"),
            nsp("rttscope_sm_ing")
        );
        per_round.push(
            serde_json::json!({"tps_off": off[round], "tps_on": on[round],
            "egr_ns": nsp("rttscope_sm_egr"), "ing_ns": nsp("rttscope_sm_ing")}),
        );
        if test_run.is_empty() {
            // one data segment out and its ACK in, run in a loop by the kernel
            let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
            let b_ip: [u8; 4] = B_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
            let data = frame(
                Tcp {
                    src: a_ip,
                    dst: b_ip,
                    sport: 40000,
                    dport: 5009,
                    seq: 1,
                    ack: 1,
                    flags: 0x18,
                    payload: 1,
                },
                0,
                false,
                5,
            );
            let ack = frame(
                Tcp {
                    src: b_ip,
                    dst: a_ip,
                    sport: 5009,
                    dport: 40000,
                    seq: 1,
                    ack: 2,
                    flags: 0x10,
                    payload: 0,
                },
                0,
                false,
                5,
            );
            for p in s.start["progs"].as_array().unwrap().iter().take(2) {
                let name = p["name"].as_str().unwrap().to_string();
                let f = if name.ends_with("egr") { &data } else { &ack };
                if let Some((ns, _)) = test_run_ns(p["id"].as_u64().unwrap(), f, 1_000_000) {
                    test_run.push((name, ns));
                }
            }
        }
        // SAFETY: end our own child (SIGTERM: it exits cleanly).
        unsafe { libc::kill(s.child.pid() as i32, libc::SIGTERM) };
        let _ = s.child.wait_output(Duration::from_secs(10));
    }
    let med = |v: &mut Vec<f64>| median(v);
    let (m_off, m_on) = (med(&mut off.clone()), med(&mut on.clone()));
    let drop_pct = (m_off - m_on) / m_off * 100.0;
    println!("sampler benchmark: match {matching}, {rounds} rounds x {secs} s, sampler on both veth ends, --sample-every {every}");
    println!("  TPS off: {off:.0?}  median {m_off:.0}");
    println!("  TPS on : {on:.0?}  median {m_on:.0}");
    println!("  TPS drop (medians): {drop_pct:.2} %");
    for (name, (ns, cnt)) in &per_prog {
        println!(
            "  {name}: {:.1} ns/packet over {cnt} runs",
            *ns as f64 / (*cnt).max(1) as f64
        );
    }
    for (name, ns) in &test_run {
        println!("  {name}: {ns:.1} ns/run in BPF_PROG_TEST_RUN (1e6 repeats; egress: a data segment, ingress: an ACK)");
    }
    println!(
        "{}",
        serde_json::json!({
            "test_run_ns": test_run.iter().map(|(n, ns)| serde_json::json!({"name": n, "ns_per_run": ns})).collect::<Vec<_>>(),
            "type": "bench_sampler", "match": matching, "sample_every": every, "rounds": rounds, "secs": secs,
            "tps_off": off, "tps_on": on, "drop_pct": drop_pct, "per_round": per_round,
            "progs": per_prog.iter().map(|(n, (ns, c))| serde_json::json!({"name": n, "run_time_ns": ns, "run_cnt": c, "ns_per_packet": *ns as f64 / (*c).max(1) as f64})).collect::<Vec<_>>(),
        })
    );
}

/// A start that fails half-way (second interface missing) leaves nothing
/// behind from the first one.
#[test]
fn failed_start_leaves_no_filter() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let out = std::process::Command::new(rttscope_bin())
        .args([
            "sample",
            "--attach",
            "clsact",
            "--iface",
            &iface(&pair.a, &pair.a_if),
            "--iface",
            &iface(&pair.a, "nope0"),
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope0"), "{err}");
    for what in [
        vec!["tc", "filter", "show", "dev", &pair.a_if, "egress"],
        vec!["tc", "filter", "show", "dev", &pair.a_if, "ingress"],
        vec!["tc", "qdisc", "show", "dev", &pair.a_if],
    ] {
        let o = pair.a.exec(&what).unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            !text.contains("rttscope") && !text.contains("clsact"),
            "{what:?}: {text}"
        );
    }
}
