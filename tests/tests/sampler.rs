//! Privileged end-to-end tests of the sampler view (bpf/sampler.bpf.c):
//! real tc programs on the veth pair of two namespaces this test creates,
//! real TCP request/response flows, checked against `ss -ti` (TCP's own
//! RTT), the think time the client applies, and packets the test crafts.
//!
//! The sampler runs as `rttscope observe --view sampler --format json` in a
//! child process, so crash and cleanup behaviour is the real one.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rttscope_e2e::frames::{csum, frame, send_frames, Tcp};
use rttscope_e2e::observer::Observer;
use rttscope_e2e::{
    busy, require_root, rttscope_bin, ss_minrtt_ms, ss_rtt_ms, NetNs, Pair, RrClient, RrServer,
    A_ADDR, A_ADDR6, B_ADDR, B_ADDR6,
};
use serde_json::{json, Value};

/// A running `rttscope observe --view sampler --format json` (the shared [`Observer`]: its
/// `start` line, `child`, `lines`).
struct Sampler(Observer);

impl std::ops::Deref for Sampler {
    type Target = Observer;
    fn deref(&self) -> &Observer {
        &self.0
    }
}

impl Sampler {
    fn start(args: &[&str]) -> Sampler {
        let mut cmd = std::process::Command::new(rttscope_bin());
        cmd.args(["observe", "--view", "sampler", "--format", "json"])
            .args(args);
        let obs = Observer::spawn(&mut cmd, "sampler");
        assert_eq!(obs.start["views"], json!(["sampler"]), "{}", obs.start);
        Sampler(obs)
    }

    /// The sampler's settings as the start line records them.
    fn settings(&self) -> &Value {
        &self.start["sampler"]["settings"]
    }

    /// How each interface is attached (`how`, `netns_inode`, ...).
    fn attached(&self) -> &Value {
        &self.start["sampler"]["attached"]
    }

    /// (name, id) of the loaded programs.
    fn progs(&self) -> Vec<(String, u64)> {
        prog_ids(&self.start)
    }

    /// Entries of the kernel's flow table (`sampler_table`), as the kernel
    /// reports the map the programs use (`bpftool`).
    fn table_entries(&self) -> u64 {
        let json = |args: &[&str]| -> Value {
            let out = std::process::Command::new("bpftool")
                .arg("-j")
                .args(args)
                .output()
                .expect("bpftool");
            serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
        };
        let (_, id) = &self.progs()[0];
        let prog = json(&["prog", "show", "id", &id.to_string()]);
        for m in prog["map_ids"].as_array().expect("map_ids") {
            let map = json(&["map", "show", "id", &m.to_string()]);
            if map["name"] == "sampler_table" {
                return map["max_entries"].as_u64().unwrap();
            }
        }
        panic!("no sampler_table among the maps of program {id}: {prog}")
    }

    /// Stop the sampler now (SIGTERM: observe prints its final report and exits) and take that
    /// report. Two samplers compared over the same traffic stop this way after it: a fixed
    /// `--duration` each would end the first one's run early by the second's start-up time
    /// (2-3 s on a loaded machine: the seq sampler of `tsval_matching_agrees_with_seq` saw 2 of
    /// the client's 1,500 transactions, the tsval one 1,258, 2026-12-07).
    fn stop(self, timeout: Duration) -> Value {
        self.0.sigterm();
        self.finish(timeout)
    }

    /// Wait for the final report (the sampler ends by itself: --duration).
    fn finish(self, timeout: Duration) -> Value {
        self.finish_raw(timeout).0
    }

    /// The final report and the raw samples (--raw) printed before it.
    ///
    /// The report is observe's `end` line reduced to the sampler view:
    /// `{"flows": [...], "counters": {...}}`, each flow `{netns, local,
    /// remote, iface, samples, min_us, mean_us, p50_us, p90_us, p99_us,
    /// max_us, hist}` from its cumulative `sampler` summary (`samples` is the
    /// histogram's count `n`; `hist` its non-empty buckets `[lower_us,
    /// upper_us (null: open), count]`).
    fn finish_raw(self, timeout: Duration) -> (Value, Vec<Value>) {
        let (end, before) = self.0.finish(timeout);
        let raw = before
            .into_iter()
            .filter(|v| v["type"] == "sample" && v["view"] == "sampler")
            .collect();
        (sampler_report(&end.expect("no end line")), raw)
    }
}

/// (name, id) of the sampler's programs in a `start` line (`prog_ids`:
/// `[name, id]` pairs or `{name, id}` objects).
fn prog_ids(start: &Value) -> Vec<(String, u64)> {
    start["sampler"]["prog_ids"]
        .as_array()
        .expect("sampler.prog_ids")
        .iter()
        .map(|p| {
            let (n, id) = match p {
                Value::Array(a) => (&a[0], &a[1]),
                _ => (&p["name"], &p["id"]),
            };
            (n.as_str().unwrap().to_string(), id.as_u64().unwrap())
        })
        .collect()
}

/// observe's `end` line, the sampler view's part (see [`Sampler::finish_raw`]).
fn sampler_report(end: &Value) -> Value {
    let flows: Vec<Value> = end["flows"]
        .as_array()
        .expect("end.flows")
        .iter()
        .filter(|f| f["sampler"].is_object())
        .map(|f| {
            let s = &f["sampler"]["summary"];
            let hist: Vec<Value> = f["sampler"]["histogram"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| {
                    let hi = b[1].as_f64().filter(|&h| h >= 0.0);
                    json!([b[0], hi, b[2]])
                })
                .collect();
            json!({
                "netns": f["netns"], "local": f["local"], "remote": f["remote"],
                "iface": f["sampler"]["iface"], "samples": s["n"],
                "min_us": s["min_us"], "mean_us": s["mean_us"], "p50_us": s["p50_us"],
                "p90_us": s["p90_us"], "p99_us": s["p99_us"], "max_us": s["max_us"],
                "hist": hist,
            })
        })
        .collect();
    json!({"flows": flows, "counters": end["counters"]["sampler"]})
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
    // Other connections to the same port open before the sampler, pings, other namespaces.
    let _busy = busy::BusyHost::start(&pair, server, busy::Responder::Plain { resp: 1 }).unwrap();
    let sampler = Sampler::start(&[
        "--iface",
        &iface(&pair.a, &pair.a_if),
        "--duration",
        "4s",
        "--interval",
        "1s",
    ]);
    assert_eq!(sampler.settings()["sample_every"], 1);
    assert_eq!(sampler.settings()["matching"], "seq");
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
    // Segments of local sockets reach the veth with CHECKSUM_PARTIAL: no ACK is refused for its
    // checksum (a wrong reading of that state would refuse them all) and none goes unchecked.
    for name in [
        "tcp_bad_checksum",
        "tcp_not_for_host",
        "tcp_checksum_unchecked",
    ] {
        assert_eq!(counter(&report, name), 0, "{name}: {report}");
    }
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
    assert_eq!(sampler.settings()["raw"], true);
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
    assert_eq!(counter(&report, "raw_events_dropped"), 0);
    let raw_here: Vec<f64> = raw
        .iter()
        .filter(|r| r["local"].as_str() == Some(&server.to_string()))
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
    // The same samples: the histogram's p50 within 1% of the exact median (issue 15), taken
    // between the two middle samples (nearest rank picks the lower one for an even count).
    let mut sorted = raw_here.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (lo, hi) = (sorted[(sorted.len() - 1) / 2], sorted[sorted.len() / 2]);
    assert!(
        p50_ms >= 0.99 * lo && p50_ms <= 1.01 * hi,
        "raw median {lo:.3}..{hi:.3} ms vs histogram p50 {p50_ms:.3} ms (within 1%)"
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
///
/// Odds of a false failure (the packets are sampled at random, in the kernel, unseeded): 12
/// clients for 5 s at one transaction per ~120 ms make ~490 transactions; take 400 to allow for
/// a loaded machine. A transaction gives an `at_think` sample when its response is sampled (1/4),
/// the client's delayed ACK is not (3/4) and the next request is (1/4): p = 3/64, so `at_think` is
/// at least Binomial(400, 3/64), mean 18.75, and P(at_think < 2) = 9.4e-8. `total` (mean ~120)
/// under 15 and `at_least` under 0.4 of it (expected 3/4: a bare ACK pairs with p = 1/16 per
/// transaction, anything later with p ~3/16) are far rarer. (With 6 clients, ~245 transactions,
/// P(at_think < 2) was 1 in ~10,000.)
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
    assert_eq!(sampler.settings()["sample_every"], 4);
    let clients: Vec<RrClient> = (0..12)
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
        "--duration",
        "4s",
        "--interval",
        "4s",
    ]);
    assert_eq!(sampler.table_entries(), 16);
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
    // Both run until stopped after the client: they see the same transactions.
    let seq = Sampler::start(&["--iface", &ifa, "--duration", "60s", "--match", "seq"]);
    let ts = Sampler::start(&["--iface", &ifa, "--duration", "60s", "--match", "tsval"]);
    assert_eq!(ts.settings()["matching"], "tsval");
    // 2 ms between requests: every request has a fresh TSval (1 ms clock)
    let client = RrClient::start(&pair.a, server, 1, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    let local = client.local;
    drop(client);
    let rs = seq.stop(Duration::from_secs(20));
    let rt = ts.stop(Duration::from_secs(20));
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
    // Both run until stopped after the client: they see the same transactions.
    let seq = Sampler::start(&["--iface", &ifr, "--duration", "60s", "--match", "seq"]);
    let r_inode = seq.attached()[0]["netns_inode"].as_u64().unwrap();
    let ts = Sampler::start(&["--iface", &ifr, "--duration", "60s", "--match", "tsval"]);
    let client = RrClient::start(&c, server, 1, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    let local = client.local;
    drop(client);
    let (rs, rt) = (
        seq.stop(Duration::from_secs(20)),
        ts.stop(Duration::from_secs(20)),
    );
    // the data sender is the client; the router's namespace is the key's
    let fs = flow(&rs, local, server).unwrap_or_else(|| panic!("seq: {rs}"));
    let ft = flow(&rt, local, server).unwrap_or_else(|| panic!("tsval: {rt}"));
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

/// A data segment is recorded at a's egress; malformed packets that would
/// acknowledge it if mis-parsed arrive at a's ingress and must be skipped
/// and counted; then one well-formed ACK produces exactly one sample.
#[test]
fn garbage_is_counted_and_never_sampled() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    drop_what_peer_sends(&pair.a);
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
    let bad = garbage_around(ack);

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
    assert_every_kind_of_garbage_counted(&report);
    assert_one_sample_from_the_good_ack(&report);
}

/// a must not answer the crafted ACKs from [`PEER`] with a RST (which clears pending state).
fn drop_what_peer_sends(a: &NetNs) {
    a.exec(&["nft", "add", "table", "inet", "rtsgarbage"])
        .unwrap();
    a.exec(&[
        "nft",
        "add chain inet rtsgarbage in { type filter hook input priority 0 ; }",
    ])
    .unwrap();
    a.exec(&[
        "nft",
        "add rule inet rtsgarbage in ip saddr 10.77.0.99 drop",
    ])
    .unwrap();
}

/// Frames that would acknowledge the data segment if mis-parsed (`ack`'s frame changed in each): IP
/// options, a fragment, bad data offsets, cut short, IP length past the frame, IP version 5,
/// UDP, three VLAN tags, no IP header, ARP, IPv6 with a fragment header; and ACKs the stack
/// drops (bad checksums, another host's MAC).
fn garbage_around(ack: Tcp) -> Vec<Vec<u8>> {
    let good = frame(ack, 0, false, 5);
    let mut bad: Vec<Vec<u8>> = vec![
        frame(ack, 1, false, 5),  // IP options
        frame(ack, 0, true, 5),   // fragment
        frame(ack, 0, false, 3),  // TCP data offset < 5
        frame(ack, 0, false, 15), // data offset past the packet
    ];
    let mut trunc = good.to_vec();
    trunc.truncate(14 + 20 + 10); // TCP header cut short
    bad.push(trunc);
    let mut longer = good.to_vec();
    longer[16..18].copy_from_slice(&200u16.to_be_bytes()); // IP length beyond the frame
    bad.push(longer);
    let mut v5 = good.to_vec();
    v5[14] = 0x55; // IP version 5
    bad.push(v5);
    let mut udp = good.to_vec();
    udp[23] = 17;
    bad.push(udp);
    // three 802.1Q tags around the good ACK (one or two are parsed: fuzz_sampler.rs)
    let mut vlan = good[..12].to_vec();
    vlan.extend([
        0x81, 0x00, 0x00, 0x07, 0x81, 0x00, 0x00, 0x08, 0x81, 0x00, 0x00, 0x09,
    ]);
    vlan.extend(&good[12..]);
    bad.push(vlan);
    bad.push(good[..14].to_vec()); // Ethernet header only: IPv4 header missing
    let mut arp = good.to_vec();
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
    // ACKs that cover the segment but that the stack drops (issue 26.5): checked over a real
    // veth, where a frame from a packet socket arrives with CHECKSUM_NONE and is summed here
    let mut ipsum = good.to_vec();
    ipsum[22] = 63; // TTL changed, IPv4 header checksum not
    bad.push(ipsum);
    let mut tcpsum = good.to_vec();
    tcpsum[48] = 0x7f; // window changed, TCP checksum not
    bad.push(tcpsum);
    let mut other = good.to_vec();
    other[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x42]); // another host's MAC
    bad.push(other);
    bad
}

/// The data segment recorded; each kind of garbage counted where it belongs, the partial ACK
/// matched nothing.
fn assert_every_kind_of_garbage_counted(report: &Value) {
    let c = |n| counter(report, n);
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
    assert_eq!(c("tcp_bad_checksum"), 2, "{}", report["counters"]);
    assert_eq!(c("tcp_not_for_host"), 1, "{}", report["counters"]);
    assert_eq!(c("tcp_checksum_unchecked"), 0, "{}", report["counters"]);
}

/// No bogus sample from the garbage; the one good ACK gives exactly one, spanning the time the
/// test waited.
fn assert_one_sample_from_the_good_ack(report: &Value) {
    let c = |n| counter(report, n);
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
struct Observed(Observer);

impl Observed {
    fn start(iface: &str, duration: &str) -> Observed {
        let mut cmd = std::process::Command::new(rttscope_bin());
        cmd.args(["observe", "--view", "sampler", "--iface", iface])
            .args(["--format", "json", "--duration", duration])
            .args(["--interval", duration]);
        Observed(Observer::spawn(&mut cmd, "observe"))
    }

    fn finish(self, timeout: Duration) -> Value {
        let (end, _) = self.0.finish(timeout);
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
    let server: SocketAddr = format!("{B_ADDR}:5005").parse().unwrap();
    let _srv = RrServer::start(&pair.b, server, 1).unwrap();
    // both loaders attach clsact filters (aya through the same netlink code), and each cleans up
    // what the other's killed run left
    for (loader, next) in [("libbpf", "aya"), ("aya", "libbpf")] {
        // the qdisc a killed run left is not known to be rttscope's and stays: start clean
        let _ = pair
            .a
            .exec(&["tc", "qdisc", "del", "dev", &pair.a_if, "clsact"]);
        a_clean_clsact_run_leaves_nothing(&pair, loader);
        a_killed_clsact_run_leaves_its_filters(&pair, loader);
        the_next_run_replaces_them_and_removes_its_own(&pair, next, server);
    }
    tcx_programs_go_with_a_killed_process(&pair);
}

/// a's `tc filter show` on one hook (empty if it fails).
fn tc_filters(pair: &Pair, dir: &str) -> String {
    pair.a
        .exec(&["tc", "filter", "show", "dev", &pair.a_if, dir])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// a's `tc qdisc show` (empty if it fails).
fn tc_qdiscs(pair: &Pair) -> String {
    pair.a
        .exec(&["tc", "qdisc", "show", "dev", &pair.a_if])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// A clean run leaves nothing: no filter, and not the clsact qdisc it created.
fn a_clean_clsact_run_leaves_nothing(pair: &Pair, loader: &str) {
    let ifa = iface(&pair.a, &pair.a_if);
    let qdiscs = || tc_qdiscs(pair);
    let s = Sampler::start(&[
        "--loader",
        loader,
        "--iface",
        &ifa,
        "--attach",
        "clsact",
        "--duration",
        "1s",
    ]);
    assert!(qdiscs().contains("clsact"), "{}", qdiscs());
    s.finish(Duration::from_secs(20));
    assert!(
        !qdiscs().contains("clsact"),
        "qdisc left behind: {}",
        qdiscs()
    );
    assert!(!tc_filters(pair, "egress").contains("rttscope"));
}

/// A run killed with SIGKILL cannot remove its legacy (clsact) filters: they outlive it.
fn a_killed_clsact_run_leaves_its_filters(pair: &Pair, loader: &str) {
    let ifa = iface(&pair.a, &pair.a_if);
    let filters = |dir: &str| tc_filters(pair, dir);
    let s = Sampler::start(&[
        "--loader",
        loader,
        "--iface",
        &ifa,
        "--attach",
        "clsact",
        "--duration",
        "60s",
    ]);
    assert_eq!(s.attached()[0]["how"], "clsact", "{}", s.start);
    assert!(
        filters("egress").contains("rtt_sampler_egr"),
        "{}",
        filters("egress")
    );
    assert!(filters("ingress").contains("rtt_sampler_ing"));
    let pid = s.child.pid();
    // SAFETY: kill our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    drop(s);
    assert!(
        filters("egress").contains("rtt_sampler_egr"),
        "legacy filters outlive the process"
    );
}

/// The next run cleans up at start, works, and removes its own filters on exit; with the peer
/// too (another namespace, often the same ifindex: one claim per interface).
fn the_next_run_replaces_them_and_removes_its_own(pair: &Pair, next: &str, server: SocketAddr) {
    let (ifa, ifb) = (iface(&pair.a, &pair.a_if), iface(&pair.b, &pair.b_if));
    let filters = |dir: &str| tc_filters(pair, dir);
    let s = Sampler::start(&[
        "--loader",
        next,
        "--iface",
        &ifa,
        "--iface",
        &ifb,
        "--attach",
        "clsact",
        "--duration",
        "2s",
    ]);
    let egress_now = filters("egress");
    assert_eq!(
        egress_now
            .lines()
            .filter(|l| l.contains("rtt_sampler_egr"))
            .count(),
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
}

/// tcx: kill -9, then the programs must disappear with the links (within 5 s).
fn tcx_programs_go_with_a_killed_process(pair: &Pair) {
    let ifa = iface(&pair.a, &pair.a_if);
    let s = Sampler::start(&["--iface", &ifa, "--duration", "60s"]);
    assert_eq!(s.attached()[0]["how"], "tcx", "{}", s.start);
    let ids: Vec<u64> = s.progs().into_iter().map(|(_, id)| id).collect();
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

/// The `counters.sampler` of the `interval` lines `s` prints within `wait`
/// (the lines already queued are dropped first).
fn intervals_within(s: &Sampler, wait: Duration) -> Vec<Value> {
    while s.lines.try_recv().is_ok() {}
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match s.lines.recv_timeout(left) {
            Ok(l) => {
                let v: Value = serde_json::from_str(&l).expect("report line is JSON");
                if v["type"] == "interval" {
                    out.push(v["counters"]["sampler"].clone());
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
            Err(_) => panic!("the observer ended early"),
        }
    }
    out
}

/// Two observers in clsact mode on one interface (issue 18, item 4): each
/// has its own filter; the second neither removes the first one's at start
/// nor takes it away at exit; the last to leave removes the clsact qdisc the
/// first created; a killed observer's filters are removed by the next start,
/// a live observer's never.
#[test]
fn clsact_observers_share_an_interface() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let ifa = iface(&pair.a, &pair.a_if);
    let tc = |args: &[&str]| -> String {
        pair.a
            .exec(args)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let filters = |dir: &str| tc(&["tc", "filter", "show", "dev", &pair.a_if, dir]);
    // our filters on a hook (one line each names its program)
    let ours = |dir: &str| {
        filters(dir)
            .lines()
            .filter(|l| l.contains("rtt_sampler_"))
            .count()
    };
    let server: SocketAddr = format!("{B_ADDR}:5006").parse().unwrap();
    let _srv = RrServer::start(&pair.b, server, 1).unwrap();
    let client = RrClient::start(&pair.a, server, 1, Duration::from_millis(1)).unwrap();
    let clsact = |duration: &str| {
        let s = Sampler::start(&[
            "--iface",
            &ifa,
            "--attach",
            "clsact",
            "--interval",
            "500ms",
            "--duration",
            duration,
        ]);
        assert_eq!(s.attached()[0]["how"], "clsact", "{}", s.start);
        s
    };
    // the observer's counters grow over the next 2 s
    let counts = |s: &Sampler, what: &str| {
        let iv = intervals_within(s, Duration::from_secs(2));
        assert!(iv.len() >= 2, "{what}: {iv:?}");
        for c in ["seen_egress", "seen_ingress", "samples"] {
            let (first, last) = (&iv[0][c], &iv[iv.len() - 1][c]);
            assert!(
                last.as_u64() > first.as_u64(),
                "{what}: {c} does not grow ({first} -> {last}): {iv:?}"
            );
        }
    };
    let stop = |s: Sampler| {
        // SAFETY: signal our own child.
        unsafe { libc::kill(s.child.pid() as i32, libc::SIGTERM) };
        s.finish(Duration::from_secs(20))
    };

    let a = clsact("60s");
    counts(&a, "A alone");
    let b = clsact("60s");
    assert_eq!(ours("egress"), 2, "{}", filters("egress"));
    assert_eq!(ours("ingress"), 2, "{}", filters("ingress"));
    counts(&a, "A while B runs");
    counts(&b, "B next to A");
    stop(b);
    assert_eq!(
        ours("egress"),
        1,
        "B took A's filter: {}",
        filters("egress")
    );
    assert_eq!(ours("ingress"), 1, "{}", filters("ingress"));
    counts(&a, "A after B exited");

    // a killed observer leaves its filters...
    let c = clsact("60s");
    assert_eq!(ours("egress"), 2, "{}", filters("egress"));
    // SAFETY: kill our own child.
    unsafe { libc::kill(c.child.pid() as i32, libc::SIGKILL) };
    drop(c);
    assert_eq!(ours("egress"), 2, "{}", filters("egress"));
    assert_eq!(ours("ingress"), 2, "{}", filters("ingress"));
    // ...which the next start removes, and only those: A's stay
    let d = clsact("60s");
    assert_eq!(ours("egress"), 2, "A's and D's: {}", filters("egress"));
    assert_eq!(ours("ingress"), 2, "A's and D's: {}", filters("ingress"));
    counts(&a, "A after D started");
    counts(&d, "D next to A");

    // A (which created the qdisc) leaves first: D keeps working, and as the
    // last one out removes its filters and the qdisc
    let report = stop(a);
    assert!(counter(&report, "samples") > 50, "{}", report["counters"]);
    assert_eq!(ours("egress"), 1, "{}", filters("egress"));
    counts(&d, "D after A exited");
    stop(d);
    drop(client);
    assert_eq!(ours("egress"), 0, "{}", filters("egress"));
    assert_eq!(ours("ingress"), 0, "{}", filters("ingress"));
    let qdiscs = tc(&["tc", "qdisc", "show", "dev", &pair.a_if]);
    assert!(!qdiscs.contains("clsact"), "qdisc left behind: {qdiscs}");
}

#[test]
fn bad_interface_is_one_clear_error() {
    if !require_root() {
        return;
    }
    let out = std::process::Command::new(rttscope_bin())
        .args([
            "observe",
            "--view",
            "sampler",
            "--iface",
            "no-such-if0",
            "--duration",
            "1s",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("rttscope: "), "{err}");
    assert!(err.contains("no-such-if0"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
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
            "observe",
            "--view",
            "sampler",
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
