//! Measurements of the lab's delay emulator for docs/perf-lab.md, run by
//! scripts/bench-lab.sh: real traffic through a testbed of network
//! namespaces. Prints `BENCH ...` lines.
//!
//!   bench_lab [delay] [rate]    (default: both, in that order)
//!
//! - delay: ping through the router with 50 ms and 1 ms configured one way
//!   (client->server), 500 pings 10 ms apart; the added delay's error at p50
//!   and p99 against an unimpaired baseline;
//! - rate: a paced UDP flood (64-byte payloads) through 1 ms of delay at the
//!   rates of BENCH_RATES (pps, comma-separated; default
//!   10000,25000,50000,100000,200000), with ping measuring the delay meanwhile.
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rttscope::lab::emulator::{Direction, Impairment, LinkConfig};
use rttscope::lab::testbed::{Role, Testbed, SRV_ADDR};
use rttscope_e2e::lab::{ping, set_rcvbuf};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench_lab: needs root (it creates network namespaces)");
        std::process::exit(1);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |name: &str| args.is_empty() || args.iter().any(|a| a == name);
    if let Some(a) = args.iter().find(|a| *a != "delay" && *a != "rate") {
        eprintln!("bench_lab: unknown benchmark {a:?} (delay, rate)");
        std::process::exit(2);
    }
    if want("delay") {
        bench_delay_accuracy();
    }
    if want("rate") {
        bench_packet_rate();
    }
}

fn bench_delay(one_way: Duration, count: usize) {
    let tb = Testbed::new().unwrap();
    let base = ping(&tb, &SRV_ADDR.to_string(), 200, "0.005");
    let mut imp = Impairment::new(&tb).unwrap();
    imp.set(Direction::Up, LinkConfig::delay(one_way)).unwrap();
    let p = ping(&tb, &SRV_ADDR.to_string(), count, "0.01");
    let cfg = one_way.as_secs_f64() * 1e3;
    // ping takes kernel receive timestamps (SO_TIMESTAMP), so busy-host
    // scheduling of ping itself does not enter its RTTs; it prints 0.001 ms
    // resolution below 10 ms and 0.1 ms from 10 to 100 ms.
    {
        let b50 = base.pct(0.5);
        println!(
            "BENCH delay ping: configured {cfg} ms one way (up only), {} probes at 10 ms: base RTT p50 {b50:.3} p99 {:.3}; with delay p50 {:.3} p99 {:.3} max {:.3}; added-delay error p50 {:+.3} ms ({:+.2} %) p99 {:+.3} ms ({:+.2} %)",
            p.rtts.len(),
            base.pct(0.99),
            p.pct(0.5),
            p.pct(0.99),
            p.pct(1.0),
            p.pct(0.5) - b50 - cfg,
            (p.pct(0.5) - b50 - cfg) / cfg * 100.0,
            p.pct(0.99) - b50 - cfg,
            (p.pct(0.99) - b50 - cfg) / cfg * 100.0,
        );
    }
    println!(
        "BENCH delay emulator after {cfg} ms: {:?}",
        imp.report().emulator
    );
}

/// Delay accuracy: ping through the router with 50 ms, then 1 ms, configured one way.
fn bench_delay_accuracy() {
    bench_delay(MS(50), 500);
    bench_delay(MS(1), 500);
}

/// `RcvbufErrors` of the UDP line in /proc/net/snmp of a namespace.
fn udp_rcvbuf_errors(tb: &Testbed, role: Role) -> u64 {
    let out = tb.exec(role, &["cat", "/proc/net/snmp"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(h), Some(v)) = (lines.next(), lines.next()) else {
        return 0;
    };
    h.split_whitespace()
        .zip(v.split_whitespace())
        .find(|(k, _)| *k == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// UDP flood client->server at `pps` (64-byte payloads) for `dur` through a
/// 1 ms up-direction delay; ping measures the delay error meanwhile.
fn flood(tb: &Testbed, imp: &Impairment, pps: u64, dur: Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let srv_path = tb.ns_path(Role::Srv);
    let (s2, g2) = (stop.clone(), got.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let recv = std::thread::spawn(move || {
        rttscope::sys::netns::enter_path(&srv_path, "lab").unwrap();
        let s = UdpSocket::bind((SRV_ADDR, 9999)).unwrap();
        s.set_read_timeout(Some(MS(100))).unwrap();
        set_rcvbuf(&s, 16 << 20);
        tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        while !s2.load(Ordering::Relaxed) {
            if s.recv(&mut buf).is_ok() {
                g2.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    rx.recv().unwrap();
    let cli_path = tb.ns_path(Role::Cli);
    let s3 = stop.clone();
    let sent = Arc::new(AtomicU64::new(0));
    let sent2 = sent.clone();
    let send = std::thread::spawn(move || {
        rttscope::sys::netns::enter_path(&cli_path, "lab").unwrap();
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect((SRV_ADDR, 9999)).unwrap();
        let buf = [0u8; 64];
        let t0 = Instant::now();
        let mut n = 0u64;
        while !s3.load(Ordering::Relaxed) {
            let due = (t0.elapsed().as_secs_f64() * pps as f64) as u64;
            while n < due {
                if s.send(&buf).is_err() {
                    break; // local queue full: the sender is the limit, retry later
                }
                n += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        sent2.store(n, Ordering::Relaxed);
    });
    let before = imp.report();
    let rcvbuf_before = udp_rcvbuf_errors(tb, Role::Srv);
    let t_start = Instant::now();
    std::thread::sleep(MS(300));
    let p = ping(
        tb,
        &SRV_ADDR.to_string(),
        ((dur.as_millis() - 300) / 20) as usize,
        "0.02",
    );
    stop.store(true, Ordering::Relaxed);
    send.join().unwrap();
    std::thread::sleep(MS(50));
    recv.join().unwrap();
    let secs = t_start.elapsed().as_secs_f64();
    let after = imp.report();
    let rcvbuf = udp_rcvbuf_errors(tb, Role::Srv) - rcvbuf_before;
    let (s, g) = (sent.load(Ordering::Relaxed), got.load(Ordering::Relaxed));
    // The kernel's own queue counters (queue_total, queue_dropped, user_dropped ...).
    let kernel = tb
        .exec(Role::Rtr, &["cat", "/proc/net/netfilter/nfnetlink_queue"])
        .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', "; "))
        .unwrap_or_default();
    println!(
        "BENCH flood {pps} pps asked: sent {:.0} pps, received {:.0} pps ({:.1} % lost, of which {rcvbuf} at the receiver's socket); emulator received {} released {} dropped_full {}, CPU {:.2} us/packet = {:.0} % of a CPU); ping through 1 ms: p50 {:.3} p99 {:.3} ms, lost {}/{}; release lateness p50 {} us p99 {} us; kernel nfnetlink_queue: {kernel}",
        s as f64 / secs,
        g as f64 / secs,
        (1.0 - g as f64 / s.max(1) as f64) * 100.0,
        after.emulator.up.received - before.emulator.up.received,
        after.emulator.up.released - before.emulator.up.released,
        after.emulator.up.dropped_full - before.emulator.up.dropped_full,
        (after.emulator.cpu_us - before.emulator.cpu_us) as f64
            / (after.emulator.up.received - before.emulator.up.received).max(1) as f64,
        (after.emulator.cpu_us - before.emulator.cpu_us) as f64 / 1e4 / secs,
        p.pct(0.5),
        p.pct(0.99),
        p.sent - p.rtts.len(),
        p.sent,
        after.emulator.late_p50_us,
        after.emulator.late_p99_us,
    );
}

/// Packet-rate limit: UDP floods at the rates of BENCH_RATES through 1 ms of delay.
fn bench_packet_rate() {
    let rates: Vec<u64> = std::env::var("BENCH_RATES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 25_000, 50_000, 100_000, 200_000]);
    let tb = Testbed::new().unwrap();
    let mut imp = Impairment::new(&tb).unwrap();
    imp.set(Direction::Up, LinkConfig::delay(MS(1))).unwrap();
    for r in rates {
        flood(&tb, &imp, r, Duration::from_secs(3));
    }
}
