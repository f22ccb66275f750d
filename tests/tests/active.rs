//! The active view end to end: `rttscope serve` in one namespace, `rttscope
//! probe` in another (veth) or the same (loopback), real traffic, checked
//! against the interval the test asked for, `ping` on the same path, loss the
//! test itself injects with nftables, and abuse of the server.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Output;
use std::time::{Duration, Instant};

use rttscope::active::framing::{Hello, HELLO_ACK};
use rttscope::active::icmp::CLOCK_KERNEL_RX;
use rttscope::active::{Kind, ProbeResult};
use rttscope_e2e::{require_root, rttscope_bin, ChildGuard, NetNs, Pair, B_ADDR, B_ADDR6};

fn bin() -> String {
    rttscope_bin().to_string_lossy().into_owned()
}

/// Start `rttscope serve` in `ns` with extra args; wait until it listens on `port`.
fn start_server(ns: &NetNs, listen: &[&str], extra: &[&str], port: u16) -> ChildGuard {
    let mut cmd = ns.command(&bin());
    cmd.arg("serve");
    for l in listen {
        cmd.args(["--listen", l]);
    }
    cmd.args(extra);
    let g = ChildGuard::spawn(&mut cmd).expect("spawn serve");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = ns
            .exec(&["ss", "-Hltn", &format!("sport = :{port}")])
            .expect("ss");
        if !out.stdout.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not start listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    g
}

/// The tests in this file run one at a time: each measures latency, and the
/// others' traffic and CPU use would be in its numbers.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run rttscope in `ns`; stdout goes to a file (a JSON result with every
/// sample is larger than a pipe holds).
fn run(ns: &NetNs, args: &[&str], timeout: Duration) -> Output {
    let path = std::env::temp_dir().join(rttscope_e2e::unique("rtsout"));
    let file = std::fs::File::create(&path).expect("temp file");
    let mut cmd = ns.command(&bin());
    cmd.args(args)
        .stdout(file)
        .stderr(std::process::Stdio::piped());
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawn rttscope")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = guard.0.as_mut().unwrap().try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            drop(guard);
            let out = std::fs::read(&path).unwrap_or_default();
            let _ = std::fs::remove_file(&path);
            panic!(
                "rttscope {args:?} did not finish within {timeout:?}; stdout: {}",
                String::from_utf8_lossy(&out[..out.len().min(2000)])
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = Vec::new();
    if let Some(mut e) = guard.0.as_mut().unwrap().stderr.take() {
        let _ = e.read_to_end(&mut stderr);
    }
    let stdout = std::fs::read(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    Output {
        status,
        stdout,
        stderr,
    }
}

fn probe_json(ns: &NetNs, args: &[&str], timeout: Duration) -> ProbeResult {
    let mut a = vec!["probe"];
    a.extend_from_slice(args);
    a.extend(["--json", "-"]);
    let out = run(ns, &a, timeout);
    assert!(
        out.status.success(),
        "probe {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    probe_result(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "probe {args:?} printed no result document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The probe's result from the result document `--json -` printed.
fn probe_result(stdout: &[u8]) -> Result<ProbeResult, String> {
    let doc = rttscope::analysis::results::RunResult::from_json(
        &String::from_utf8_lossy(stdout),
        "<stdout>",
    )
    .map_err(|e| e.to_string())?;
    rttscope::active::output::probe_from_document(&doc).ok_or_else(|| "not one probe's".into())
}

/// Results present and ordered: min <= p50 <= p90 <= p99 <= max, all positive and below `max_us`.
fn assert_sane(r: &ProbeResult, max_us: f64) {
    let s = &r.summary;
    assert!(r.counts.received > 0, "no transactions: {:?}", r.counts);
    assert_eq!(s.n, r.counts.received, "summary n vs received");
    assert_eq!(r.samples.len() as u64, r.counts.received);
    assert!(
        0.0 < s.min && s.min <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.max,
        "unordered summary {s:?}"
    );
    assert!(s.p50 < max_us, "p50 {} us is not a local RTT", s.p50);
    assert!(s.mean >= s.min && s.mean <= s.max, "mean {s:?}");
    let np = &r.netperf;
    assert!(
        np.p50 <= np.p90 && np.p90 <= np.p99,
        "netperf percentiles {np:?}"
    );
    assert!(
        (np.p50 as f64 - s.p50).abs() <= 0.1 * s.p50 + 2.0,
        "netperf-style p50 {} far from exact {}",
        np.p50,
        s.p50
    );
    if r.settings.kind == Kind::Icmp {
        // ICMP is timed like ping: the kernel's receive stamp on every reply
        // (a fallback would mean a reply without SCM_TIMESTAMPNS, or a
        // realtime clock step during the run).
        assert_eq!(r.settings.clock, CLOCK_KERNEL_RX);
        assert_eq!(r.counts.rx_timestamp_fallbacks, 0, "{:?}", r.counts);
    } else {
        assert_eq!(r.settings.clock, "CLOCK_MONOTONIC");
        assert_eq!(r.counts.rx_timestamp_fallbacks, 0);
    }
}

#[test]
fn tcp_and_udp_rr_over_veth_v4_and_v6() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7878");
    let l6 = format!("[{B_ADDR6}]:7878");
    let _srv = start_server(&p.b, &[&l4, &l6], &[], 7878);

    let r = probe_json(
        &p.a,
        &["tcp-rr", B_ADDR, "-l", "1"],
        Duration::from_secs(10),
    );
    assert_sane(&r, 5000.0);
    assert_eq!(r.counts.sent, r.counts.received);
    assert_eq!(r.counts.errors, 0);
    assert!(
        r.counts.received > 200,
        "back to back for 1 s: only {} transactions",
        r.counts.received
    );
    assert_eq!((r.settings.req_size, r.settings.resp_size), (1, 1));
    assert_eq!((r.settings.interval_ns, r.settings.burst), (0, 1));
    assert_eq!(r.settings.duration_s, Some(1.0));
    // netperf's transactions/s: completed / -l.
    assert_eq!(r.run_s, 1.0);
    assert_eq!(r.throughput, r.counts.received as f64 / 1.0);
    assert!((0.9..1.2).contains(&r.elapsed_s), "elapsed {}", r.elapsed_s);

    let r6 = probe_json(
        &p.a,
        &[
            "tcp-rr",
            B_ADDR6,
            "-n",
            "300",
            "-r",
            "100,2000",
            "--nodelay",
        ],
        Duration::from_secs(10),
    );
    assert_sane(&r6, 5000.0);
    assert_eq!(r6.counts.received, 300);
    // -n: no run length to divide by; the time the 300 took.
    assert_eq!(r6.run_s, r6.elapsed_s);
    assert_eq!(r6.throughput, 300.0 / r6.elapsed_s);
    assert!(r6.settings.nodelay);
    assert_eq!((r6.settings.req_size, r6.settings.resp_size), (100, 2000));

    let u = probe_json(
        &p.a,
        &["udp-rr", B_ADDR6, "-n", "500"],
        Duration::from_secs(10),
    );
    assert_sane(&u, 5000.0);
    assert_eq!(u.counts.received, 500, "{:?}", u.counts);
    assert_eq!(u.counts.lost + u.counts.duplicates + u.counts.late, 0);
    assert_eq!(
        u.settings.req_size, 16,
        "UDP sizes are raised to the 16-byte header"
    );

    // Human and netperf -o output.
    let out = run(
        &p.a,
        &[
            "probe",
            "tcp-rr",
            B_ADDR,
            "-n",
            "50",
            "-o",
            "MIN_LATENCY,P50_LATENCY,P99_LATENCY,THROUGHPUT,THROUGHPUT_UNITS",
        ],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("Minimum Latency Microseconds,50th Percentile"),
        "{text}"
    );
    let vals: Vec<&str> = lines[1].split(',').collect();
    let min: f64 = vals[0].parse().unwrap();
    let p50: f64 = vals[1].parse().unwrap();
    let p99: f64 = vals[2].parse().unwrap();
    assert!(min <= p50 && p50 <= p99, "{text}");
    assert_eq!(vals[4], "Trans/s");
}

#[test]
fn intervals_are_honoured() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7879");
    let _srv = start_server(&p.b, &[&l4], &[], 7879);
    // Several runs in parallel would disturb each other's pacing less than
    // the machine's load does; run them one after the other, 2 s each.
    let cases: [(&str, &[&str], u64); 3] = [
        ("tcp-rr", &["-w", "10ms", "-l", "2"], 200),
        ("udp-rr", &["-w", "10ms", "-l", "2"], 200),
        ("tcp-rr", &["-w", "20ms", "-b", "3", "-l", "1"], 150),
    ];
    for (kind, extra, want) in cases {
        let mut args = vec![kind, B_ADDR, "-p", "7879"];
        args.extend_from_slice(extra);
        let r = probe_json(&p.a, &args, Duration::from_secs(10));
        assert_sane(&r, 20_000.0);
        let n = r.counts.sent;
        let tol = want / 10;
        // Under load a burst an interval late restarts the grid (a slot skipped): the slots of
        // the run's span less the bursts sent are the skipped ones (not each gap's rounded
        // slots: a late burst then an early one is no skip), and transactions plus those must
        // be what -l and -w allow. Never more.
        let iv = r.settings.interval_ns as f64;
        let burst_n = r.settings.burst as u64;
        let bstarts: Vec<u64> = r
            .samples
            .iter()
            .step_by(burst_n as usize)
            .map(|s| s.0)
            .collect();
        let span_slots = match (bstarts.first(), bstarts.last()) {
            (Some(a), Some(b)) => ((b - a) as f64 / iv).round() as u64 + 1,
            _ => 0,
        };
        let skipped = span_slots.saturating_sub(bstarts.len() as u64) * burst_n;
        assert!(
            n <= want + tol && (n + skipped).abs_diff(want) <= tol,
            "{kind} {extra:?}: {n} transactions + {skipped} slots skipped under load, expected {want} +- {tol}"
        );
        // The recorded settings say what was asked.
        assert_eq!(
            r.settings.interval_ns,
            if want == 150 { 20_000_000 } else { 10_000_000 }
        );
        // Burst starts are an interval apart: median gap between the first transactions of bursts.
        let burst = r.settings.burst as usize;
        let starts: Vec<u64> = r.samples.iter().step_by(burst).map(|s| s.0).collect();
        let mut gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort();
        let med = gaps[gaps.len() / 2] as f64 / 1e6;
        let want_ms = r.settings.interval_ns as f64 / 1e6;
        assert!(
            (med - want_ms).abs() < 0.5,
            "{kind}: median burst gap {med} ms, want {want_ms} ms"
        );
    }
    // Spinning instead of sleeping, 5 ms. A spinning process is CPU-bound and on
    // a loaded machine gets only its share of a CPU: the scheduler preempts it
    // for whole slices (ms), so starts come late and, late by an interval or
    // more, restart the grid (a longer gap with no shorter one to match). On
    // this shared 2-core machine the median gap was seen at 5.43 ms. The
    // median gap must still be the interval within 10% (0.5 ms); a pacer that
    // ignored the interval (back to back: ~0.05 ms) or doubled it fails, and
    // so does a machine with more CPU hogs than cores, where the spinner
    // really misses most slots (3 extra busy loops here: median 10 ms).
    let r = probe_json(
        &p.a,
        &[
            "tcp-rr", B_ADDR, "-p", "7879", "-w", "5ms", "--spin", "-n", "100",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(r.counts.received, 100);
    assert!(r.settings.spin);
    let mut gaps: Vec<u64> = r.samples.windows(2).map(|w| w[1].0 - w[0].0).collect();
    gaps.sort();
    let q = |f: f64| gaps[((gaps.len() - 1) as f64 * f) as usize] as f64 / 1e6;
    let med = q(0.5);
    assert!(
        (med - 5.0).abs() <= 0.5,
        "spin: median gap {med} ms, want 5 ms +- 0.5 ms (gaps ms: min {} p25 {} p75 {} max {})",
        q(0.0),
        q(0.25),
        q(0.75),
        q(1.0)
    );
    // Count instead of duration.
    let r = probe_json(
        &p.a,
        &["udp-rr", B_ADDR, "-p", "7879", "-n", "37", "-w", "1ms"],
        Duration::from_secs(10),
    );
    assert_eq!(r.counts.sent, 37);
    assert_eq!(r.settings.count, Some(37));
}

#[test]
fn sigterm_ends_a_probe_with_its_result() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7878");
    let _srv = start_server(&p.b, &[&l4], &[], 7878);
    for extra in [&[][..], &["--async-io"][..], &["-w", "10ms"][..]] {
        let path = std::env::temp_dir().join(rttscope_e2e::unique("rtsterm"));
        let mut cmd = p.a.command(&bin());
        cmd.args(["probe", "tcp-rr", B_ADDR, "-l", "60", "--json", "-"])
            .args(extra);
        cmd.stdout(std::fs::File::create(&path).unwrap());
        let mut g = ChildGuard(Some(cmd.spawn().unwrap()));
        std::thread::sleep(Duration::from_millis(1500));
        let pid = nix::unistd::Pid::from_raw(g.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let t = Instant::now();
        let st = loop {
            if let Some(st) = g.0.as_mut().unwrap().try_wait().unwrap() {
                break st;
            }
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{extra:?}: probe ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(st.success(), "{extra:?}: exit {st:?}");
        let r = probe_result(&out).expect("result after SIGTERM");
        assert!(
            r.counts.received > 0 && r.counts.sent == r.counts.received,
            "{:?}",
            r.counts
        );
        assert!(
            r.elapsed_s > 0.5 && r.elapsed_s < 3.0,
            "{extra:?}: elapsed {}",
            r.elapsed_s
        );
    }
}

/// `probe icmp` speaks ping: a header, a line per reply as it arrives
/// (icmp_seq counted from 1, time= in ms), ping's statistics at the end;
/// `-w` is a deadline, not an interval.
#[test]
fn icmp_probe_prints_like_ping() {
    if !require_root() {
        return;
    }
    let ns = NetNs::new("rtsp").unwrap();
    let out = run(
        &ns,
        &[
            "probe",
            "icmp",
            "127.0.0.1",
            "-c",
            "3",
            "-i",
            "0.05",
            "-w",
            "5",
        ],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "PING 127.0.0.1 56(84) bytes of data.", "{text}");
    for (i, l) in lines[1..4].iter().enumerate() {
        assert!(
            l.starts_with(&format!(
                "64 bytes from 127.0.0.1: icmp_seq={} ttl=64 time=",
                i + 1
            )) && l.ends_with(" ms"),
            "reply line {i}: {text}"
        );
        let t: f64 = l
            .split("time=")
            .nth(1)
            .unwrap()
            .trim_end_matches(" ms")
            .parse()
            .unwrap();
        assert!(t > 0.0 && t < 50.0, "{text}");
    }
    assert!(text.contains("3 packets transmitted, 3 received"), "{text}");
    // -q: the statistics only
    let out = run(
        &ns,
        &["probe", "icmp", "127.0.0.1", "-c", "2", "-i", "0.05", "-q"],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("icmp_seq="), "{text}");
    assert!(text.contains("2 packets transmitted, 2 received"), "{text}");
}

#[test]
fn loopback_probe_and_serve() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    // A namespace of our own: its loopback, no port clash with anything else.
    let ns = NetNs::new("rtsl").unwrap();
    let _srv = start_server(&ns, &["127.0.0.1:7878", "[::1]:7878"], &[], 7878);
    for (kind, host) in [
        ("tcp-rr", "127.0.0.1"),
        ("udp-rr", "::1"),
        ("tcp-rr", "::1"),
    ] {
        let r = probe_json(&ns, &[kind, host, "-n", "2000"], Duration::from_secs(20));
        assert_sane(&r, 2000.0);
        assert_eq!(r.counts.received, 2000);
    }
    let r = probe_json(
        &ns,
        &["icmp", "127.0.0.1", "-c", "50", "-i", "1ms"],
        Duration::from_secs(10),
    );
    assert_sane(&r, 2000.0);
    assert_eq!(r.counts.received, 50);
    assert!(r.settings.icmp_socket.is_some());
}

/// Median of ping's per-reply `time=` values, in microseconds.
fn ping_median_us(text: &str) -> (f64, usize) {
    let mut v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next())
        .filter_map(|x| x.parse::<f64>().ok())
        .map(|ms| ms * 1000.0)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    (v.get(v.len() / 2).copied().unwrap_or(f64::NAN), v.len())
}

#[test]
fn icmp_probe_agrees_with_ping() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    // ping times the reply with the kernel's receive timestamp (SO_TIMESTAMP)
    // against a realtime reading just before sendto(), so the wake-up of the
    // process is not in its number. The probe now does the same
    // (SO_TIMESTAMPNS), so it is compared without --spin. What is left is
    // the path itself, and on this machine that depends on whether the sender
    // slept: right after a sleep the kernel's send path is slower (cold CPU).
    // Below ~10 ms intervals ping busy-polls between echoes (non-blocking
    // recvmsg and sched_yield); at 20 ms it sleeps in a blocking recvmsg, as
    // the probe sleeps on its timerfd. So: ping -i 0.02 and the probe at
    // 20 ms, both at the same time so that both see the same load (the
    // medians of sleeping senders move with it; at 20 ms intervals and
    // ~50 us per echo the two rarely meet). Tolerance: 20% of ping's median,
    // or 15 us on these ~30-50 us veth RTTs, whichever is larger; up to 3
    // attempts because the machine is shared and a burst of load moves medians.
    let mut agreed = None;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (ping, r) = std::thread::scope(|sc| {
            let t = sc.spawn(|| {
                p.a.exec(&["ping", "-n", "-c", "100", "-i", "0.02", B_ADDR])
                    .expect("ping")
            });
            let r = probe_json(
                &p.a,
                &["icmp", B_ADDR, "-c", "100", "-i", "20ms"],
                Duration::from_secs(20),
            );
            (t.join().expect("ping thread"), r)
        });
        let (ping_med, ping_n) = ping_median_us(&String::from_utf8_lossy(&ping.stdout));
        assert!(ping_n >= 95, "ping got {ping_n} replies");
        assert_sane(&r, 5000.0);
        assert!(r.counts.received >= 95, "{:?}", r.counts);
        assert_eq!(r.counts.duplicates, 0);
        assert!(!r.settings.spin);
        let ours = r.summary.p50;
        let tol = (0.2 * ping_med).max(15.0);
        seen.push((ours, ping_med));
        eprintln!("icmp p50 {ours} us, ping median {ping_med} us, tolerance {tol} us");
        if (ours - ping_med).abs() <= tol {
            agreed = Some(r);
            break;
        }
    }
    let Some(r) = agreed else {
        panic!(
            "rttscope icmp p50 vs ping median (us), per attempt: {seen:?} (tolerance: 20% of ping's or 15 us)"
        );
    };
    other_modes_and_ipv6_are_sane(&p);
    // New namespaces allow no group to open datagram ICMP sockets, so
    // the probe used raw ones; allowing every group in this (the
    // test's own) namespace makes it use the unprivileged kind.
    assert_eq!(r.settings.icmp_socket.as_deref(), Some("raw"));
    unprivileged_sockets_once_allowed(&p);
}

/// --busy-poll and --spin, and IPv6: sane (kernel stamps, no loss beyond a rare late echo).
fn other_modes_and_ipv6_are_sane(p: &Pair) {
    // --busy-poll reads replies with non-blocking recvmsg in a loop: also
    // kernel stamps (assert_sane). Not compared with ping: at -i 0.002 ping
    // busy-polls too, but it yields the CPU (sched_yield) each turn, so under
    // contention it is not like --busy-poll (seen with 3 extra CPU hogs: ping
    // 33-47 us, --busy-poll 8 us; without them 8-11 vs 8-9). --spin spins
    // the wait between echoes only.
    for flag in ["--busy-poll", "--spin"] {
        let s = probe_json(
            &p.a,
            &["icmp", B_ADDR, "-c", "50", "-i", "2ms", flag],
            Duration::from_secs(10),
        );
        assert_sane(&s, 5000.0);
        assert_eq!(
            (s.settings.spin, s.settings.busy_poll),
            (flag == "--spin", flag == "--busy-poll")
        );
        eprintln!("{flag}: icmp p50 {} us", s.summary.p50);
    }
    // Also IPv6 runs and is sane (no ping6 comparison needed for agreement).
    let r6 = probe_json(
        &p.a,
        &["icmp", B_ADDR6, "-c", "50", "-i", "2ms"],
        Duration::from_secs(10),
    );
    assert_sane(&r6, 5000.0);
    // A reply slower than the 1 s timeout on this shared machine is
    // possible (load spikes); a lost echo or two is not a failure here.
    let c6 = &r6.counts;
    assert!(
        c6.received >= 45 && c6.received + c6.lost == c6.sent,
        "{c6:?} {:?}",
        r6.last_error
    );
}

/// With every group allowed in the test's namespace, the probe uses datagram ICMP sockets.
fn unprivileged_sockets_once_allowed(p: &Pair) {
    p.a.exec(&["sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647"])
        .unwrap();
    for host in [B_ADDR, B_ADDR6] {
        let d = probe_json(
            &p.a,
            &["icmp", host, "-c", "50", "-i", "2ms"],
            Duration::from_secs(10),
        );
        assert_sane(&d, 5000.0);
        let c = &d.counts;
        assert!(
            c.received >= 45 && c.received + c.lost == c.sent,
            "{host}: {c:?}"
        );
        assert_eq!(d.settings.icmp_socket.as_deref(), Some("dgram"), "{host}");
    }
}

#[test]
fn udp_loss_is_counted_and_timed_out() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7878");
    let _srv = start_server(&p.b, &[&l4], &[], 7878);
    // Drop 30% of the requests on the server's side (its own namespace).
    p.b.exec(&["nft", "add", "table", "inet", "rtsloss"])
        .unwrap();
    p.b.exec(&[
        "nft",
        "add",
        "chain",
        "inet",
        "rtsloss",
        "in",
        "{ type filter hook input priority 0 ; }",
    ])
    .unwrap();
    p.b.exec(&[
        "nft", "add", "rule", "inet", "rtsloss", "in", "udp", "dport", "7878", "numgen", "random",
        "mod", "100", "<", "30", "drop",
    ])
    .unwrap();
    let t = Instant::now();
    let r = probe_json(
        &p.a,
        &["udp-rr", B_ADDR, "-n", "400", "-W", "20ms"],
        Duration::from_secs(30),
    );
    let took = t.elapsed();
    let c = &r.counts;
    assert_eq!(c.sent, 400);
    assert_eq!(c.received + c.lost, c.sent, "{c:?}");
    let frac = c.lost as f64 / c.sent as f64;
    assert!(
        (0.2..=0.4).contains(&frac),
        "lost {frac:.3} of requests, nft drops 0.30: {c:?}"
    );
    assert_eq!(c.duplicates, 0, "{c:?}");
    // A reply that misses the 20 ms timeout on a loaded machine is counted as
    // late (and its transaction as lost): allow a few, not a pattern.
    assert!(
        c.late <= c.sent / 50,
        "{} late replies of {}: {c:?}",
        c.late,
        c.sent
    );
    // Each loss costs one 20 ms timeout, not forever.
    assert!(
        took < Duration::from_secs(8),
        "took {took:?} for {} losses",
        c.lost
    );
    assert_eq!(r.settings.timeout_ns, 20_000_000);
    assert_sane(&r, 5000.0);
}

fn read_until_closed(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn server_survives_abuse_and_enforces_limits() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7878");
    let srv = start_server(
        &p.b,
        &[&l4],
        &[
            "--max-conns",
            "3",
            "--idle-timeout",
            "1s",
            "--max-size",
            "65536",
        ],
        7878,
    );
    let server: SocketAddr = l4.parse().unwrap();
    let report = p.a.run(move || {
        let mut notes = malformed_clients_are_closed(server);
        notes.extend(connection_limit_and_idle_timeout_hold(server));
        notes
    });
    for (what, ok) in &report {
        assert!(*ok, "{what}: failed; all: {report:?}");
    }
    // Everyone else is still served.
    let r = probe_json(
        &p.a,
        &["tcp-rr", B_ADDR, "-n", "200"],
        Duration::from_secs(10),
    );
    assert_eq!(r.counts.received, 200);
    let u = probe_json(
        &p.a,
        &["udp-rr", B_ADDR, "-n", "200"],
        Duration::from_secs(10),
    );
    assert_eq!(u.counts.received, 200);
    // A probe asking for more than --max-size gets one clear sentence.
    let out = run(
        &p.a,
        &["probe", "tcp-rr", B_ADDR, "-n", "1", "-r", "1,100000"],
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("rttscope: ") && err.contains("closed the connection after the hello"),
        "{err}"
    );
    // The server logged each violation, and is still alive until we stop it.
    // `ip netns exec` execs the program, so the child's pid is rttscope's.
    let pid = nix::unistd::Pid::from_raw(srv.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = srv.wait_output(Duration::from_secs(5)).unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "framing violation",
        "connection limit 3 reached",
        "sent no hello",
        "bad UDP request",
        "exceeds the limit",
        "\"mid_request_disconnects\":1",
    ] {
        assert!(log.contains(needle), "server log lacks '{needle}':\n{log}");
    }
}

type Notes = Vec<(&'static str, bool)>;

/// Half hellos, garbage, a 4 GiB ask, half a request: each closed or dropped.
fn malformed_clients_are_closed(server: SocketAddr) -> Notes {
    let mut notes = Vec::new();
    let connect = || TcpStream::connect_timeout(&server, Duration::from_secs(2)).unwrap();
    // Half a hello, then gone.
    let mut s = connect();
    s.write_all(b"RTS1\0\0").unwrap();
    drop(s);
    // Garbage: disconnected.
    let mut s = connect();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    notes.push((
        "garbage closed",
        read_until_closed(&mut s, Duration::from_secs(2)),
    ));
    // Asks for a 4 GiB response: disconnected, nothing sent.
    let mut s = connect();
    s.write_all(
        &Hello {
            req: 1,
            resp: u32::MAX,
            flags: 0,
        }
        .encode(),
    )
    .unwrap();
    notes.push((
        "4GiB closed",
        read_until_closed(&mut s, Duration::from_secs(2)),
    ));
    // Valid hello, half a request, then gone.
    let mut s = connect();
    s.write_all(
        &Hello {
            req: 1000,
            resp: 1,
            flags: 0,
        }
        .encode(),
    )
    .unwrap();
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack).unwrap();
    notes.push(("ack", ack == HELLO_ACK));
    s.write_all(&[0u8; 500]).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(100));
    notes
}

/// Three silent connections fill the limit, a fourth is refused at once, the idle timeout
/// (1 s) closes the silent ones; then UDP garbage.
fn connection_limit_and_idle_timeout_hold(server: SocketAddr) -> Notes {
    let mut notes = Vec::new();
    let connect = || TcpStream::connect_timeout(&server, Duration::from_secs(2)).unwrap();
    let mut silent: Vec<TcpStream> = (0..3).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut fourth = connect();
    let _ = fourth.write_all(
        &Hello {
            req: 1,
            resp: 1,
            flags: 0,
        }
        .encode(),
    );
    notes.push((
        "over limit closed",
        read_until_closed(&mut fourth, Duration::from_millis(500)),
    ));
    // The idle timeout (1 s) closes the silent ones.
    let t = Instant::now();
    for s in silent.iter_mut() {
        notes.push((
            "silent closed",
            read_until_closed(s, Duration::from_secs(3)),
        ));
    }
    notes.push((
        "idle timeout near 1 s",
        t.elapsed() < Duration::from_millis(1800),
    ));
    // UDP garbage.
    let u = UdpSocket::bind("0.0.0.0:0").unwrap();
    for i in 0..50u8 {
        let _ = u.send_to(&[i; 20], server);
    }
    let _ = u.send_to(b"RTU1\xff\xff\xff\xff01234567", server);
    notes
}

/// The server's counters from the JSON line it prints when it stops.
fn serve_stats(log: &str) -> serde_json::Value {
    let line = log
        .lines()
        .find_map(|l| l.strip_prefix("rttscope serve: stopped; "))
        .unwrap_or_else(|| panic!("no stats line in the server's log:\n{log}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("stats line {line}: {e}"))
}

/// Issue 18, items 2 and 5, against the real binary on a namespace's own
/// loopback (127.0.0.1 and ::1 only): no UDP reply larger than its request
/// without a cookie, the cookie handshake through `probe udp-rr`, the
/// per-source UDP rate, a whole-request deadline against a slowloris, the
/// per-source connection limit, and rejections logged at most ten times (then
/// every thousandth).
#[test]
fn serve_bounds_amplification_slowloris_and_per_peer_on_loopback() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let ns = NetNs::new("rtsab").unwrap();
    let srv = start_server(
        &ns,
        &["127.0.0.1:7878", "[::1]:7878"],
        &[
            "--idle-timeout",
            "1s",
            "--max-conns-per-peer",
            "4",
            "--udp-rate",
            "200",
            "--udp-burst",
            "20",
        ],
        7878,
    );
    let server: SocketAddr = "127.0.0.1:7878".parse().unwrap();
    let (notes, held) = ns.run(move || {
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.connect(server).unwrap();
        let mut notes = vec![
            amplifier_gets_no_more_than_it_sent(&u),
            udp_rate_is_held(&u),
            slowloris_is_cut(server),
        ];
        let held = per_source_limit_holds(server, &mut notes);
        (notes, held)
    });
    let (held, early_refusals) = held;
    for (what, ok) in &notes {
        assert!(*ok, "{what}: failed; all: {notes:?}");
    }
    other_sources_and_probes_are_served(&ns, held);
    server_counted_and_logged_each_refusal(srv, early_refusals);
}

/// The amplifier datagram: "RTU1" + pack("!IQ", 65507, 1), 16 bytes.
fn amplifier_gets_no_more_than_it_sent(u: &UdpSocket) -> (String, bool) {
    u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut amp = b"RTU1".to_vec();
    amp.extend_from_slice(&65507u32.to_be_bytes());
    amp.extend_from_slice(&1u64.to_be_bytes());
    u.send(&amp).unwrap();
    let mut buf = vec![0u8; 65536];
    let n = u.recv(&mut buf).unwrap_or(usize::MAX);
    (
        format!(
            "16-byte request asking for 65507 got a reply of {n} bytes ({:02x?})",
            &buf[..n.min(24)]
        ),
        n <= amp.len(),
    )
}

/// The per-source rate: 200/s, burst 20.
fn udp_rate_is_held(u: &UdpSocket) -> (String, bool) {
    let mut buf = vec![0u8; 65536];
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    for seq in 0..400u64 {
        let mut req = [b'q'; 16];
        req[..4].copy_from_slice(b"RTU1");
        req[4..8].copy_from_slice(&16u32.to_be_bytes());
        req[8..16].copy_from_slice(&seq.to_be_bytes());
        let _ = u.send(&req);
        if seq % 20 == 19 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    u.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut got = 0u32;
    while u.recv(&mut buf).is_ok() {
        got += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    (
        format!("{got} replies to 400 requests in {secs:.2} s at 200/s burst 20"),
        got >= 20 && (got as f64) <= 20.0 + 200.0 * secs + 5.0,
    )
}

/// Slowloris: a 1 MiB request, one byte every 300 ms, 1 s deadline.
fn slowloris_is_cut(server: SocketAddr) -> (String, bool) {
    let mut s = TcpStream::connect_timeout(&server, Duration::from_secs(2)).unwrap();
    s.write_all(
        &Hello {
            req: 1 << 20,
            resp: 1,
            flags: 0,
        }
        .encode(),
    )
    .unwrap();
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack).unwrap();
    let t = Instant::now();
    let mut bytes = 0;
    while t.elapsed() < Duration::from_secs(6) {
        if s.write_all(b"x").is_err() {
            break;
        }
        bytes += 1;
        if read_until_closed(&mut s, Duration::from_millis(300)) {
            break;
        }
    }
    let took = t.elapsed();
    (
        format!("slowloris ({bytes} bytes) disconnected after {took:?}"),
        took < Duration::from_secs(2),
    )
}

/// Per-source limit 4: four held, the fifth and 300 more refused; the four held and the
/// refusals seen before them returned. A connection is held once the server answered its
/// hello. The slowloris connection's slot is released when its server thread ends, a moment
/// after its socket closed: a busy machine may refuse one of the first connections for that;
/// such a refusal is retried (for at most 3 s) and listed.
fn per_source_limit_holds(
    server: SocketAddr,
    notes: &mut Vec<(String, bool)>,
) -> (Vec<TcpStream>, u64) {
    let connect = || TcpStream::connect_timeout(&server, Duration::from_secs(2)).unwrap();
    let hello = Hello {
        req: 1,
        resp: 1,
        flags: 0,
    }
    .encode();
    let mut held: Vec<TcpStream> = Vec::new();
    let mut early_refusals = 0u64;
    let t = Instant::now();
    while held.len() < 4 && t.elapsed() < Duration::from_secs(3) {
        let mut s = connect();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut ack = [0u8; 4];
        if s.write_all(&hello).is_ok() && s.read_exact(&mut ack).is_ok() {
            held.push(s);
        } else {
            early_refusals += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    notes.push((
        format!(
            "{} connections from 127.0.0.1 held (answered their hello) in {:?}, {early_refusals} refused while the slowloris slot was released",
            held.len(),
            t.elapsed()
        ),
        held.len() == 4,
    ));
    let mut fifth = connect();
    notes.push((
        // Refused at the accept; the idle watchdog would take 1 s.
        "5th connection from 127.0.0.1 closed within 0.5 s".into(),
        read_until_closed(&mut fifth, Duration::from_millis(500)),
    ));
    for _ in 0..300 {
        let mut s = connect();
        let _ = read_until_closed(&mut s, Duration::from_secs(1));
    }
    (held, early_refusals)
}

/// Another source (::1) is served while 127.0.0.1 holds its four; 127.0.0.1 again once they
/// are released; the UDP probe does the cookie handshake.
fn other_sources_and_probes_are_served(ns: &NetNs, held: Vec<TcpStream>) {
    let r = probe_json(ns, &["tcp-rr", "::1", "-n", "200"], Duration::from_secs(10));
    assert_eq!(r.counts.received, 200);
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let r = probe_json(
        ns,
        &["tcp-rr", "127.0.0.1", "-n", "200"],
        Duration::from_secs(10),
    );
    assert_eq!(r.counts.received, 200);
    // 24-byte requests, 60000-byte responses, every one answered (10 ms apart: below the
    // 200/s rate).
    let r = probe_json(
        ns,
        &[
            "udp-rr",
            "127.0.0.1",
            "-n",
            "50",
            "-w",
            "10ms",
            "-r",
            "1,60000",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(r.counts.received, 50, "{:?}", r.counts);
    assert_eq!((r.settings.req_size, r.settings.resp_size), (24, 60000));
}

/// The server's own counters at exit, and ten log lines for 301 refusals.
fn server_counted_and_logged_each_refusal(srv: ChildGuard, early_refusals: u64) {
    let pid = nix::unistd::Pid::from_raw(srv.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = srv.wait_output(Duration::from_secs(5)).unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let st = serve_stats(&log);
    let n = |k: &str| st[k].as_u64().unwrap_or_else(|| panic!("no {k} in {st}"));
    assert_eq!(n("udp_cookie_required"), 1, "{st}");
    assert!(n("udp_cookie_requests") >= 1, "{st}");
    assert!(n("udp_rate_limited") > 0, "{st}");
    assert_eq!(n("slow_requests"), 1, "{st}");
    assert_eq!(n("over_peer_limit"), 301 + early_refusals, "{st}");
    let lines = log
        .lines()
        .filter(|l| l.contains("per-source connection limit 4 reached"))
        .count();
    assert_eq!(lines, 10, "refusal log lines:\n{log}");
    for needle in [
        "not complete within",
        "without a valid cookie",
        "over the UDP rate",
    ] {
        assert!(log.contains(needle), "server log lacks '{needle}':\n{log}");
    }
}

/// Issue 15: transactions/s is netperf's, completed transactions / `-l`,
/// not / (first send -> last reply): a run paced at 10 ms for 2 s has at most
/// 200 transactions and reads at most 100.00/s (it read 100.25 at `-l 4`).
#[test]
fn paced_transactions_per_second_is_completed_over_the_run_length() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let l4 = format!("{B_ADDR}:7881");
    let _srv = start_server(&p.b, &[&l4], &[], 7881);
    for kind in ["tcp-rr", "udp-rr"] {
        let r = probe_json(
            &p.a,
            &[kind, B_ADDR, "-p", "7881", "-w", "10ms", "-l", "2"],
            Duration::from_secs(10),
        );
        assert_sane(&r, 20_000.0);
        let n = r.counts.received;
        assert_eq!((r.run_s, r.settings.duration_s), (2.0, Some(2.0)));
        assert_eq!(r.throughput, n as f64 / 2.0, "{kind}: {n} transactions");
        assert!(
            (90.0..=100.0).contains(&r.throughput),
            "{kind}: {} Trans/s for {n} transactions paced at 10 ms over 2 s (first send -> last reply {} s)",
            r.throughput,
            r.elapsed_s
        );
    }
    // The human line prints the two numbers it divides.
    let out = run(
        &p.a,
        &[
            "probe", "tcp-rr", B_ADDR, "-p", "7881", "-w", "10ms", "-l", "2",
        ],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    let n: u64 = first
        .split(": ")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no transaction count in {text}"));
    assert!(
        first.ends_with(&format!(
            "{n} transactions in 2.00 s, {:.2} Trans/s",
            n as f64 / 2.0
        )),
        "{text}"
    );
}

/// A responder that holds each reply `delay` (speaks serve's hello), on `addr` in `ns`.
fn slow_responder(ns: &NetNs, addr: &str, delay: Duration) -> std::thread::JoinHandle<()> {
    let addr: SocketAddr = addr.parse().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = ns.spawn(move || {
        let l = std::net::TcpListener::bind(addr).expect("bind");
        tx.send(()).unwrap();
        // Two probe runs, one connection each.
        for _ in 0..2 {
            let (mut s, _) = l.accept().expect("accept");
            let mut hello = [0u8; 16];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&HELLO_ACK).unwrap();
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).is_ok() {
                std::thread::sleep(delay);
                if s.write_all(b"r").is_err() {
                    break;
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("responder up");
    h
}

/// recvfrom() calls of a probe run, counted by strace (the kernel's view).
fn probe_recv_calls(ns: &NetNs, args: &[&str]) -> (ProbeResult, u64) {
    let trace = std::env::temp_dir().join(rttscope_e2e::unique("rtstrace"));
    let tpath = trace.to_string_lossy().into_owned();
    let mut a = vec![
        "strace",
        "-f",
        "-qq",
        "-c",
        "-e",
        "trace=recvfrom",
        "-o",
        &tpath,
    ];
    let b = bin();
    a.push(&b);
    a.push("probe");
    a.extend_from_slice(args);
    a.extend(["--json", "-"]);
    let out = ns.exec(&a).expect("strace");
    let table = std::fs::read_to_string(&trace).unwrap_or_default();
    let _ = std::fs::remove_file(&trace);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = probe_result(&out.stdout).expect("result document");
    let calls = table
        .lines()
        .find(|l| l.trim_end().ends_with("recvfrom"))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // % time, seconds, usecs/call, calls, [errors], syscall
            f.get(3).and_then(|c| c.parse().ok())
        })
        .unwrap_or_else(|| panic!("no recvfrom line in strace's table:\n{table}"));
    (r, calls)
}

/// Issue 15: `--spin` is netperf's `--enable-spin`: it spins the wait
/// between transactions and waits for the reply in a blocking recv(); only
/// `--busy-poll` polls the reply. Against a responder that holds each reply
/// 30 ms, a blocking wait is one recvfrom() per transaction (strace counts
/// them), polling is hundreds.
#[test]
fn spin_spins_the_pacing_wait_and_busy_poll_polls_the_reply() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let addr = format!("{B_ADDR}:7882");
    let srv = slow_responder(&p.b, &addr, Duration::from_millis(30));
    let n = 10u64;
    let base = [
        "tcp-rr", B_ADDR, "-p", "7882", "-n", "10", "-w", "50ms", "-W", "5",
    ];
    let mut spin_args = base.to_vec();
    spin_args.push("--spin");
    let (r, spin_calls) = probe_recv_calls(&p.a, &spin_args);
    assert_eq!(r.counts.received, n);
    assert!((r.settings.spin, r.settings.busy_poll) == (true, false));
    assert!(
        r.summary.p50 >= 30_000.0,
        "the responder holds replies 30 ms: {:?}",
        r.summary
    );
    // Paced by spinning: starts 50 ms apart.
    let mut gaps: Vec<u64> = r.samples.windows(2).map(|w| w[1].0 - w[0].0).collect();
    gaps.sort();
    let med = gaps[gaps.len() / 2] as f64 / 1e6;
    assert!(
        (med - 50.0).abs() <= 5.0,
        "--spin: median gap {med} ms, want 50"
    );
    let mut poll_args = base.to_vec();
    poll_args.push("--busy-poll");
    let (r, poll_calls) = probe_recv_calls(&p.a, &poll_args);
    assert_eq!(r.counts.received, n);
    assert!((r.settings.spin, r.settings.busy_poll) == (false, true));
    srv.join().unwrap();
    eprintln!("recvfrom calls for {n} transactions: --spin {spin_calls}, --busy-poll {poll_calls}");
    // A few more than one per transaction: the hello's reply, read through the reactor.
    assert!(
        spin_calls <= 2 * n + 5,
        "--spin made {spin_calls} recvfrom calls for {n} transactions: it polls the reply"
    );
    assert!(
        poll_calls >= 20 * n,
        "--busy-poll made only {poll_calls} recvfrom calls for {n} 30 ms replies"
    );
}

/// netperf's -l ends the test: a TCP transaction still in flight when -l is over (a responder
/// holding its reply, as TCP's backoff does under loss) ends with the run and does not count; it
/// does not hold the run until -W and fail it. Both I/O modes.
#[test]
fn a_transaction_in_flight_at_the_end_of_l_ends_with_the_run() {
    if !require_root() {
        return;
    }
    let _serial = serial();
    let p = Pair::new().unwrap();
    let addr = format!("{B_ADDR}:7883");
    let srv = slow_responder(&p.b, &addr, Duration::from_millis(2500));
    for extra in [None, Some("--async-io")] {
        let mut args = vec!["tcp-rr", B_ADDR, "-p", "7883", "-l", "1", "-W", "10"];
        args.extend(extra);
        let t0 = std::time::Instant::now();
        let r = probe_json(&p.a, &args, Duration::from_secs(30));
        let took = t0.elapsed();
        assert_eq!(
            (r.counts.sent, r.counts.received),
            (0, 0),
            "{extra:?}: the one transaction in flight at the end does not count: {:?}",
            r.counts
        );
        assert!(
            took < Duration::from_millis(2300),
            "{extra:?}: the run took {took:?}: it waited for the held reply (2.5 s) or -W (10 s)"
        );
        // The responder answers one connection at a time: let it give up the first.
        std::thread::sleep(Duration::from_millis(1800));
    }
    srv.join().unwrap();
}
