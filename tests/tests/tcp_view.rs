//! The TCP view against real TCP flows between two network namespaces.
//! Truths: `ss -ti` (the kernel's own srtt), the think time the test sets.
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use rttscope_e2e::*;

const PORT: u16 = 5001;

fn server_addr() -> SocketAddr {
    format!("{B_ADDR}:{PORT}").parse().unwrap()
}

/// `rttscope observe --format json` on both ends of the pair, with `extra`
/// options, on a thread (the test drives traffic meanwhile).
fn observe_pair(
    p: &Pair,
    extra: &[&str],
    timeout: Duration,
) -> std::thread::JoinHandle<anyhow::Result<Vec<serde_json::Value>>> {
    observe_netns(&[&p.a, &p.b], extra, timeout)
}

/// The same for any namespaces.
fn observe_netns(
    namespaces: &[&NetNs],
    extra: &[&str],
    timeout: Duration,
) -> std::thread::JoinHandle<anyhow::Result<Vec<serde_json::Value>>> {
    let mut args: Vec<String> = Vec::new();
    for ns in namespaces {
        args.extend(["--netns".to_string(), ns.name.clone()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    observe_json_attached(args, timeout)
}

/// With an observer starting: 0.7 s later a request/response client (5 ms
/// between transactions) for 1.2 s, then paused so that srtt stays put (the
/// connection stays open); the client and `ss`'s rtt of its socket (ms).
fn rr_then_freeze(p: &Pair) -> (RrClient, f64) {
    std::thread::sleep(Duration::from_millis(700));
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    cli.pause();
    std::thread::sleep(Duration::from_millis(200));
    let ss_client = ss_rtt_ms(&p.a, cli.local.port())
        .unwrap()
        .expect("ss shows the client socket");
    (cli, ss_client)
}

/// Percentile field of a flow's cumulative summary in the `end` line.
fn end_summary(lines: &[serde_json::Value], netns: &str, local: &str) -> serde_json::Value {
    end_flow(lines, netns, local).unwrap_or_else(|| {
        panic!("no flow {local} in {netns} in the observer's end line: {lines:#?}")
    })["tcp"]
        .clone()
}

#[test]
fn srtt_matches_ss_for_both_ends() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let obs = observe_pair(
        &p,
        &["--interval", "500ms", "--duration", "3s"],
        Duration::from_secs(20),
    );
    let (cli, ss_client) = rr_then_freeze(&p);
    let ss_server = ss_rtt_ms(&p.b, PORT)
        .unwrap()
        .expect("ss shows the server socket");
    let lines = obs.join().unwrap().unwrap();
    let local = cli.local.to_string();
    let c = end_summary(&lines, &p.a.name, &local);
    let s = end_summary(&lines, &p.b.name, &server_addr().to_string());
    for (what, ours, ss) in [("client", &c, ss_client), ("server", &s, ss_server)] {
        let ours_ms = ours["srtt_us"].as_f64().unwrap() / 1000.0;
        let tol = (0.2 * ss).max(0.050);
        assert!(
            (ours_ms - ss).abs() <= tol,
            "{what}: observer srtt {ours_ms:.3} ms vs ss rtt {ss:.3} ms (tolerance {tol:.3} ms); flow: {ours}"
        );
        assert!(
            ours["summary"]["n"].as_u64().unwrap() > 20,
            "{what}: too few samples: {ours}"
        );
    }
    // Sides: the connecting end is the client, the accepting end the server.
    assert_eq!(
        end_flow(&lines, &p.a.name, &local).unwrap()["side"],
        "client"
    );
    assert_eq!(
        end_flow(&lines, &p.b.name, &server_addr().to_string()).unwrap()["side"],
        "server"
    );
}

#[test]
fn connection_opened_before_start_is_reported() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = cli.transactions.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        before > 10,
        "traffic was flowing before the observer started ({before} transactions)"
    );
    let lines = observe_json(
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--interval",
            "500ms",
            "--duration",
            "2s",
        ],
        Duration::from_secs(20),
    )
    .unwrap();
    let start = &lines[0];
    assert!(
        start["tcp"]["existing_enabled"].as_u64().unwrap() >= 2,
        "iterator enabled both ends: {start}"
    );
    for (ns, local, side) in [
        (&p.a.name, cli.local.to_string(), "client"),
        (&p.b.name, server_addr().to_string(), "server"),
    ] {
        let f = end_flow(&lines, ns, &local).unwrap_or_else(|| {
            panic!("pre-existing flow {local} in {ns} not reported: {lines:#?}")
        });
        assert_eq!(f["origin"], "existing", "{f}");
        assert_eq!(f["side"], side, "{f}");
        assert!(f["tcp"]["summary"]["n"].as_u64().unwrap() > 10, "{f}");
    }
}

#[test]
fn delayed_ack_inflates_server_side_only() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let obs = observe_pair(
        &p,
        &["--interval", "1s", "--duration", "3s"],
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(500));
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(20)).unwrap();
    let lines = obs.join().unwrap().unwrap();
    let c = end_summary(&lines, &p.a.name, &cli.local.to_string());
    let s = end_summary(&lines, &p.b.name, &server_addr().to_string());
    let c50 = c["summary"]["p50_us"].as_f64().unwrap() / 1000.0;
    let s50 = s["summary"]["p50_us"].as_f64().unwrap() / 1000.0;
    assert!(
        (15.0..=30.0).contains(&s50),
        "server-side TCP RTT p50 {s50:.3} ms, expected 15-30 ms (20 ms think time): {s}"
    );
    assert!(
        c50 < 2.0,
        "client-side TCP RTT p50 {c50:.3} ms, expected < 2 ms: {c}"
    );
}

#[test]
fn kill_9_leaves_nothing_attached() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let mut cmd = Command::new(rttscope_bin());
    cmd.args([
        "observe",
        "--format",
        "json",
        "--netns",
        &p.a.name,
        "--interval",
        "200ms",
    ]);
    let mut child = ChildGuard::spawn(&mut cmd).unwrap();
    // Wait for the start line (attached), reading stdout.
    let mut stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut byte = [0u8; 1];
    while !buf.contains(&b'\n') {
        assert!(Instant::now() < deadline, "observer did not start");
        use std::io::Read;
        if stdout.read(&mut byte).unwrap() == 0 {
            let out = child.wait_output(Duration::from_secs(1));
            panic!("observer exited early: {out:?}");
        }
        buf.push(byte[0]);
    }
    let start: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    let ids: Vec<u64> = start["tcp"]["prog_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(
        !ids.is_empty() && ids.iter().all(|&i| i > 0),
        "start line has prog ids: {start}"
    );
    for id in &ids {
        assert!(
            sh(&["bpftool", "prog", "show", "id", &id.to_string()]).is_ok(),
            "prog {id} loaded while running"
        );
    }
    let pid = child.pid() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.0.as_mut().unwrap().wait();
    // Programs are freed when the last link/fd goes (asynchronously: poll).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| sh(&["bpftool", "prog", "show", "id", &id.to_string()]).is_ok())
            .collect();
        let links =
            String::from_utf8(sh(&["bpftool", "-j", "link", "show"]).unwrap().stdout).unwrap();
        let links: serde_json::Value =
            serde_json::from_str(&links).unwrap_or(serde_json::Value::Null);
        let linked: Vec<u64> = links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["prog_id"].as_u64())
            .filter(|id| ids.contains(id))
            .collect();
        if alive.is_empty() && linked.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after kill -9: programs {alive:?} still loaded, links to {linked:?} still present"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_input_gets_one_sentence() {
    if !require_root() {
        return;
    }
    let bin = rttscope_bin();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "observe",
                "--netns",
                "no-such-netns-rts",
                "--duration",
                "1s",
            ],
            "unknown network namespace",
        ),
        (
            &["observe", "--cgroup", "/no/such/cgroup", "--duration", "1s"],
            "does not exist",
        ),
        (&["observe", "--addr", "10.0.0.0/40"], "invalid value"),
        (&["observe", "--duration", "soon"], "not a duration"),
    ];
    for (args, want) in cases {
        let out = Command::new(&bin).args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains(want),
            "{args:?}: stderr {err:?} should mention {want:?}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{args:?}: {err}"
        );
    }
    // Without capabilities: drop them all and run as nobody.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(&bin)
        .args(["observe", "--duration", "1s"])
        .output();
    if let Ok(out) = out {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "unprivileged observe should fail");
        assert!(
            err.contains("needs root or the capabilities"),
            "stderr: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");
    }
}

/// The flow table is a fixed array of slots (--max-flows). Closed flows give
/// their slot back once reported (early, between reports, when the table is
/// more than half full), and when few slots are left the least recently
/// active flows are evicted: churn of three times the capacity within about
/// one report interval, then more idle connections than slots, must not stop
/// a busy flow that starts afterwards from being measured, and every churned
/// connection must have been reported closed.
#[test]
fn slots_are_reused_and_idle_flows_evicted() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let obs = observe_pair(
        &p,
        &["--max-flows", "16", "--interval", "1s", "--duration", "7s"],
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_millis(700));
    // Churn: 24 connections one after another (48 sockets: 3x the slots).
    let mut churned = Vec::new();
    for _ in 0..24 {
        let c = RrClient::start(&p.a, server_addr(), 2, Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        churned.push(c.local.to_string());
        drop(c);
    }
    // Until the last churned flows were reported and their slots freed (at
    // the latest at the next 1 s report): otherwise the idle sockets below
    // find the table still full of closed flows, never get a slot (they
    // send nothing more) and there is nothing to evict.
    std::thread::sleep(Duration::from_millis(1300));
    // Idle: 10 open connections (20 sockets), then a busy one.
    let idle: Vec<RrClient> = (0..10)
        .map(|_| RrClient::start_paused(&p.a, server_addr(), 2, Duration::ZERO, true).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let busy = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    let lines = obs.join().unwrap().unwrap();
    drop(idle);

    let reported_closed: std::collections::HashSet<String> = lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["flows"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["netns_name"] == p.a.name.as_str() && f["closed"] == true)
        .filter_map(|f| f["local"].as_str().map(str::to_string))
        .collect();
    let missing: Vec<&String> = churned
        .iter()
        .filter(|c| !reported_closed.contains(*c))
        .collect();
    assert!(
        missing.is_empty(),
        "churned connections never reported closed: {missing:?} (reported: {reported_closed:?})"
    );
    let f = end_flow(&lines, &p.a.name, &busy.local.to_string())
        .unwrap_or_else(|| panic!("busy flow {} not reported: {lines:#?}", busy.local));
    assert!(
        f["tcp"]["summary"]["n"].as_u64().unwrap() > 50,
        "busy flow measured: {f}"
    );
    let c = last_interval_counters(&lines, "tcp");
    assert!(
        c["flows_evicted"].as_u64().unwrap() > 0,
        "idle flows evicted when slots ran low: {c}"
    );
    assert!(
        c["flows_closed_reported"].as_u64().unwrap() >= 48,
        "both ends of every churned connection reported closed: {c}"
    );
}

/// The same addresses and ports in two namespaces (a container's loopback
/// traffic, say) are two pairs of flows. Their sockets share one slot hint
/// (the hint's hash has no namespace in it): each callback must then find
/// its own socket's slot, never the other namespace's. One namespace's
/// client pauses 20 ms between requests (its server side measures ~20 ms,
/// the delayed-ACK effect), the other runs back to back (well under 2 ms):
/// mixed-up samples would show in both the medians and the counts.
#[test]
fn same_addresses_in_two_namespaces_stay_apart() {
    if !require_root() {
        return;
    }
    let slow = NetNs::new("rtsh").unwrap();
    let fast = NetNs::new("rtsh").unwrap();
    let srv: SocketAddr = "127.0.0.1:7100".parse().unwrap();
    let cli: SocketAddr = "127.0.0.1:40123".parse().unwrap();
    let _s1 = RrServer::start(&slow, srv, 2).unwrap();
    let _s2 = RrServer::start(&fast, srv, 2).unwrap();
    let obs = observe_netns(
        &[&slow, &fast],
        &["--interval", "1s", "--duration", "3s"],
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(500));
    let c_slow = RrClient::start_bound(&slow, cli, srv, 2, Duration::from_millis(20)).unwrap();
    let c_fast = RrClient::start_bound(&fast, cli, srv, 2, Duration::ZERO).unwrap();
    let lines = obs.join().unwrap().unwrap();
    let n_slow = c_slow
        .transactions
        .load(std::sync::atomic::Ordering::Relaxed) as u64;
    let n_fast = c_fast
        .transactions
        .load(std::sync::atomic::Ordering::Relaxed) as u64;
    drop((c_slow, c_fast));
    let flow = |ns: &NetNs, local: &str| {
        end_flow(&lines, &ns.name, local)
            .unwrap_or_else(|| panic!("no flow {local} in {}: {lines:#?}", ns.name))["tcp"]
            .clone()
    };
    let (slow_srv, slow_cli) = (
        flow(&slow, "127.0.0.1:7100"),
        flow(&slow, "127.0.0.1:40123"),
    );
    let (fast_srv, fast_cli) = (
        flow(&fast, "127.0.0.1:7100"),
        flow(&fast, "127.0.0.1:40123"),
    );
    // A flow without samples has no p50: NaN fails every range check below.
    let p50 = |f: &serde_json::Value| {
        f["summary"]["p50_us"]
            .as_f64()
            .map_or(f64::NAN, |x| x / 1000.0)
    };
    let n = |f: &serde_json::Value| f["summary"]["n"].as_u64().unwrap_or(0);
    let seen = format!(
        "slow ns ({n_slow} transactions): server {slow_srv}, client {slow_cli}\n\
         fast ns ({n_fast} transactions): server {fast_srv}, client {fast_cli}"
    );
    assert!(
        (15.0..=30.0).contains(&p50(&slow_srv)),
        "paused client's server side should measure ~20 ms:\n{seen}"
    );
    assert!(
        p50(&fast_srv) < 2.0 && p50(&fast_cli) < 2.0 && p50(&slow_cli) < 2.0,
        "back-to-back flows and the paused client's side should stay under 2 ms:\n{seen}"
    );
    assert!(
        n_fast > 10 * n_slow,
        "the back-to-back client should run far more transactions:\n{seen}"
    );
    // One RTT sample per round trip at most (plus the handshake's): samples
    // of the busy namespace landing in the paused one would exceed it.
    for f in [&slow_srv, &slow_cli] {
        assert!(
            n(f) <= 2 * n_slow + 5,
            "paused namespace's flow has more samples than round trips:\n{seen}"
        );
    }
    let c = last_interval_counters(&lines, "tcp");
    assert!(
        c["rtt_hint_misses"].as_u64().unwrap() > 0,
        "the two namespaces' sockets share hints, so some callbacks must miss: {c}"
    );
}

/// The optional per-ACK hook (fexit/tcp_ack_update_rtt) is probed with
/// `--ack-hook try`. Where the kernel refuses fexit (this project's test
/// kernel): one notice line, the record says why, and the RTT callback
/// keeps sampling; `--ack-hook require` fails in one sentence. Where the
/// kernel allows it: the hook is attached, the RTT callback is not used, and
/// the hook's samples agree with `ss` like the callback's do.
#[test]
fn ack_hook_is_probed_and_skipped_with_one_notice() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let bin = rttscope_bin();
    let mut cmd = Command::new(&bin);
    cmd.args([
        "observe",
        "--format",
        "json",
        "--ack-hook",
        "try",
        "--netns",
        &p.a.name,
        "--netns",
        &p.b.name,
        "--interval",
        "500ms",
        "--duration",
        "2500ms",
    ]);
    let child = ChildGuard::spawn(&mut cmd).unwrap();
    let (cli, ss_client) = rr_then_freeze(&p);
    let out = child.wait_output(Duration::from_secs(20)).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "observe --ack-hook try failed: {stderr}"
    );
    let lines = parse_lines(&out.stdout).unwrap();
    let tcp = &lines[0]["tcp"];
    let status = tcp["ack_hook"].as_str().unwrap_or_default().to_string();
    assert_eq!(lines[0]["settings"]["ack_hook"], "try", "{}", lines[0]);
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("per-ACK hook"))
        .collect();
    let c = end_summary(&lines, &p.a.name, &cli.local.to_string());
    let n = c["summary"]["n"].as_u64().unwrap_or(0);
    let srtt_ms = c["srtt_us"].as_f64().unwrap_or(0.0) / 1000.0;
    eprintln!(
        "ack hook: {status}; rtt source: {}; notices: {notices:?}; client samples {n}, srtt {srtt_ms:.3} ms vs ss {ss_client:.3} ms",
        tcp["rtt_source"]
    );
    assert!(n > 20, "too few client samples ({status}): {c}");
    let tol = (0.2 * ss_client).max(0.050);
    assert!(
        (srtt_ms - ss_client).abs() <= tol,
        "srtt {srtt_ms:.3} ms vs ss {ss_client:.3} ms ({status})"
    );
    let require = Command::new(&bin)
        .args(["observe", "--ack-hook", "require", "--duration", "1s"])
        .output()
        .unwrap();
    let require_err = String::from_utf8_lossy(&require.stderr);
    if status == "attached" {
        assert!(notices.is_empty(), "{notices:?}");
        assert!(
            tcp["rtt_source"]
                .as_str()
                .unwrap()
                .contains("tcp_ack_update_rtt"),
            "{tcp}"
        );
        assert!(require.status.success(), "{require_err}");
    } else {
        assert!(status.starts_with("refused: "), "{tcp}");
        assert_eq!(notices.len(), 1, "one notice line: {stderr}");
        assert!(
            notices[0].contains("fexit/tcp_ack_update_rtt") && notices[0].contains("RTT callback"),
            "{}",
            notices[0]
        );
        assert!(
            tcp["rtt_source"].as_str().unwrap().starts_with("RTT_CB"),
            "{tcp}"
        );
        assert!(!require.status.success(), "require should fail here");
        assert_eq!(
            require_err.trim().lines().count(),
            1,
            "one sentence: {require_err}"
        );
        assert!(
            require_err.contains("--ack-hook require") && !require_err.contains("panicked"),
            "{require_err}"
        );
    }
    // Whatever the outcome, nothing of ours stays loaded once it exited.
    let left = Command::new("bpftool")
        .args(["prog", "show"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("rtt_tcp_ack"), // names fit in 15 characters
        "hook program left loaded"
    );
}
