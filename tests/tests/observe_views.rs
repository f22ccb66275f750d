//! Both passive views through `rttscope observe`, joined on the same flows.
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use rttscope_e2e::*;

#[test]
fn sampler_and_tcp_view_agree_on_the_client_side() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5002").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let ib = format!("{}:{}", p.b.name, p.b_if);
    let lines = observe_json(
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--view",
            "tcp,sampler",
            "--iface",
            &ia,
            "--iface",
            &ib,
            "--interval",
            "1s",
            "--duration",
            "3s",
        ],
        Duration::from_secs(30),
    )
    .unwrap();
    let start = &lines[0];
    assert_eq!(
        start["views"],
        serde_json::json!(["tcp", "sampler"]),
        "{start}"
    );
    assert_eq!(start["sampler"]["settings"]["sample_every"], 1, "{start}");
    assert_eq!(start["sampler"]["settings"]["matching"], "seq", "{start}");
    let f = end_flow(&lines, &p.a.name, &cli.local.to_string())
        .unwrap_or_else(|| panic!("client flow missing: {lines:#?}"));
    let tcp50 = f["tcp"]["summary"]["p50_us"].as_f64().unwrap();
    let smp50 = f["sampler"]["summary"]["p50_us"]
        .as_f64()
        .unwrap_or_else(|| panic!("no sampler stats on the client row: {f}"));
    // The sampler sits below IP: it misses the stack time inside TCP's own
    // samples, a few microseconds that matter at a ~50 us RTT: 20% + 10 us.
    let tol = 0.2 * tcp50 + 10.0;
    assert!((smp50 - tcp50).abs() <= tol, "client side: sampler p50 {smp50:.1} us vs TCP view p50 {tcp50:.1} us (tolerance {tol:.1} us): {f}");
    // Every interval row that has sampler stats also names the view's settings in the start line;
    // the interval lines carry the sampler's counters.
    let iv = lines.iter().find(|l| l["type"] == "interval").unwrap();
    assert!(
        iv["counters"]["sampler"]["samples"].as_u64().unwrap() > 0,
        "{iv}"
    );
    // Totals per side (issue 15): each side's total is the sum of that
    // side's rows, and the two ends are never merged.
    for iv in lines.iter().filter(|l| l["type"] == "interval") {
        for view in ["tcp", "sampler"] {
            for side in ["client", "server"] {
                let rows: u64 = iv["flows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|r| r["side"] == side)
                    .filter_map(|r| r[view]["n"].as_u64())
                    .sum();
                let total = iv["totals"][view][side]["n"].as_u64().unwrap_or(0);
                assert_eq!(total, rows, "{view} {side} total vs rows: {iv}");
            }
        }
    }
}

/// An observed interface deleted while `observe` runs (issue 18 item 9): one
/// notice on stderr naming it, counted in the sampler's `ifaces_vanished`;
/// the intervals keep coming, the other interface's samples keep growing,
/// and observe exits 0.
#[test]
fn a_deleted_interface_is_said_once_and_the_rest_goes_on() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let if2 = second_interface_in_a(&p);
    let server: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let i1 = format!("{}:{}", p.a.name, p.a_if);
    let i2 = format!("{}:{}", p.a.name, if2);
    let (stdout, stderr) = observe_while_deleting(&p, (&i1, &i2), &if2);
    assert_one_notice_names_the_gone_interface(&stderr, &i2, &p.a_if);
    let lines = parse_lines(&stdout).unwrap();
    assert_intervals_go_on_and_count_it(&lines, &cli.local.to_string(), (&i1, &i2));
}

/// A second interface in namespace a: another veth pair to b, up, with an address.
fn second_interface_in_a(p: &Pair) -> String {
    let if2 = unique("vc");
    let if2_peer = unique("vd");
    sh(&[
        "ip", "link", "add", &if2, "netns", &p.a.name, "type", "veth", "peer", "name", &if2_peer,
        "netns", &p.b.name,
    ])
    .unwrap();
    p.a.exec(&["ip", "addr", "add", "10.78.0.1/24", "dev", &if2])
        .unwrap();
    p.a.exec(&["ip", "link", "set", &if2, "up"]).unwrap();
    if2
}

/// `observe --view tcp,sampler` on both interfaces for 4 s; `if2` deleted once it reported an
/// interval: its stdout and stderr (it must exit 0).
fn observe_while_deleting(p: &Pair, (i1, i2): (&str, &str), if2: &str) -> (Vec<u8>, String) {
    let mut cmd = std::process::Command::new(rttscope_bin());
    cmd.args([
        "observe",
        "--view",
        "tcp,sampler",
        "--netns",
        &p.a.name,
        "--iface",
        i1,
        "--iface",
        i2,
        "--format",
        "json",
        "--interval",
        "300ms",
        "--duration",
        "4s",
    ]);
    let path = std::env::temp_dir().join(unique("rtsdel"));
    cmd.stdout(std::fs::File::create(&path).unwrap())
        .stderr(std::process::Stdio::piped());
    let child = ChildGuard(Some(cmd.spawn().unwrap()));
    // delete the interface once the observer is attached and reported an
    // interval (loading takes longer on a busy machine: no fixed sleep)
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&path)
        .unwrap_or_default()
        .contains("\"type\":\"interval\"")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "observer did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p.a.exec(&["ip", "link", "del", if2]).unwrap();
    let out = child.wait_output(Duration::from_secs(30)).unwrap();
    let stdout = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "observe failed: {stderr}");
    (stdout, stderr)
}

/// One notice, saying the deleted interface is gone; the other one not mentioned.
fn assert_one_notice_names_the_gone_interface(stderr: &str, i2: &str, a_if: &str) {
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rttscope: notice:"))
        .collect();
    assert_eq!(notices.len(), 1, "one notice expected: {stderr}");
    assert!(
        notices[0].contains(&format!("interface {i2} is gone")),
        "{stderr}"
    );
    assert!(!stderr.contains(a_if), "if1 is not mentioned: {stderr}");
}

/// Intervals keep coming, count the vanished interface (and no vanished namespace), and the
/// client flow's sampler samples (on if1) keep coming after the deletion; the end counts it.
fn assert_intervals_go_on_and_count_it(
    lines: &[serde_json::Value],
    local: &str,
    (i1, i2): (&str, &str),
) {
    let ivs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    assert!(
        ivs.len() >= 8,
        "intervals keep coming: {} of them",
        ivs.len()
    );
    let last = ivs.last().unwrap();
    assert_eq!(last["counters"]["sampler"]["ifaces_vanished"], 1, "{last}");
    assert_eq!(last["counters"]["tcp"]["netns_vanished"], 0, "{last}");
    assert_eq!(
        ivs[0]["counters"]["sampler"]["ifaces_vanished"], 0,
        "{}",
        ivs[0]
    );
    let sampled = |iv: &serde_json::Value| -> u64 {
        iv["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["local"] == local)
            .filter_map(|f| f["sampler"]["n"].as_u64())
            .sum()
    };
    let late: u64 = ivs[ivs.len() - 4..].iter().map(|iv| sampled(iv)).sum();
    assert!(
        late > 0,
        "no sampler samples on {i1} after {i2} was deleted: {last}"
    );
    let end = lines.iter().find(|l| l["type"] == "end").expect("end line");
    assert_eq!(end["counters"]["sampler"]["ifaces_vanished"], 1, "{end}");
}

/// The whole run (issue 15): a connection that closed before the observer
/// stopped is still in the `end` record (closed: true, with its whole-run
/// statistics) and in the closing table (side marked `*`); the end record's
/// TCP counters carry the tracker's counters like the interval records.
/// A `--cgroup` removed while observe runs (issue 26.12): one notice, `cgroup_vanished` 1 in
/// the TCP view's counters from then on, and observe goes on. Before, nothing was said: the
/// programs stay on the removed cgroup and see no new connection.
#[test]
fn a_removed_cgroup_is_said_once() {
    if !require_root() {
        return;
    }
    // the cgroup v2 mount (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host)
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let root = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| f[1].to_string())
        .expect("a cgroup v2 mount");
    let dir = std::path::Path::new(&root).join(unique("rtscg"));
    std::fs::create_dir(&dir).unwrap();
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let guard = Rm(dir.clone());
    let out_path = std::env::temp_dir().join(unique("rtscgout"));
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--view", "tcp", "--cgroup"])
        .arg(&dir)
        .args([
            "--format",
            "json",
            "--interval",
            "300ms",
            "--duration",
            "3s",
        ]);
    cmd.stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::process::Stdio::piped());
    let child = ChildGuard(Some(cmd.spawn().unwrap()));
    let t0 = std::time::Instant::now();
    while !std::fs::read_to_string(&out_path)
        .unwrap_or_default()
        .contains("\"type\":\"interval\"")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "observer did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_dir(&dir).unwrap();
    drop(guard);
    let out = child.wait_output(Duration::from_secs(30)).unwrap();
    let stdout = std::fs::read(&out_path).unwrap();
    let _ = std::fs::remove_file(&out_path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "observe failed: {stderr}");
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rttscope: notice:"))
        .collect();
    assert_eq!(notices.len(), 1, "one notice expected: {stderr}");
    assert!(
        notices[0].contains(&format!("cgroup {} is gone", dir.display())),
        "{stderr}"
    );
    let lines = parse_lines(&stdout).unwrap();
    let ivs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    assert_eq!(
        ivs[0]["counters"]["tcp"]["cgroup_vanished"], 0,
        "{}",
        ivs[0]
    );
    let last = ivs.last().unwrap();
    assert_eq!(last["counters"]["tcp"]["cgroup_vanished"], 1, "{last}");
}

#[test]
fn closed_flows_are_in_the_whole_run_summary() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    // Other connections to the same port open before the observer, pings, other namespaces.
    let busy = busy::BusyHost::start(&p, server, busy::Responder::Plain { resp: 2 }).unwrap();
    for format in ["json", "table"] {
        // The observer first (its output in a file, to see when it has
        // attached), then the client: every transaction is the truth.
        let path = std::env::temp_dir().join(unique("rtswhole"));
        let mut cmd = Command::new(rttscope_bin());
        cmd.args(["observe", "--format", format, "--netns", &p.a.name])
            .args(["--interval", "500ms", "--duration", "4s"])
            .stdout(std::fs::File::create(&path).unwrap());
        let obs = ChildGuard(Some(
            cmd.stderr(std::process::Stdio::piped()).spawn().unwrap(),
        ));
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&path)
            .unwrap_or_default()
            .is_empty()
        {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "observer did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(2)).unwrap();
        let local = cli.local.to_string();
        std::thread::sleep(Duration::from_millis(1500));
        let transactions = cli.transactions.load(std::sync::atomic::Ordering::Relaxed) as u64;
        drop(cli); // closes the connection
        let out = obs.wait_output(Duration::from_secs(30)).unwrap();
        let stdout = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let text = String::from_utf8_lossy(&stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(transactions > 50, "client made {transactions} transactions");
        if format == "json" {
            let lines = parse_lines(&stdout).unwrap();
            let f = end_flow(&lines, &p.a.name, &local).unwrap_or_else(|| {
                panic!("closed flow {local} missing from the end record: {text}")
            });
            assert_eq!(f["closed"], true, "{f}");
            let n = f["tcp"]["summary"]["n"].as_u64().unwrap();
            // One RTT sample per transaction of this flow, whatever else runs: + the handshake's
            // sample and the one transaction that may end between the count and the close.
            assert!(
                n + 1 >= transactions && n <= transactions + 2,
                "whole-run n {n} vs {transactions} transactions: {f}\n{}",
                busy.describe()
            );
            let end = lines.iter().find(|l| l["type"] == "end").unwrap();
            for k in [
                "flows_tracked",
                "flows_evicted",
                "flows_vanished",
                "flows_closed_reported",
            ] {
                assert!(
                    end["counters"]["tcp"][k].is_u64(),
                    "end counters lack {k}: {end}"
                );
            }
        } else {
            let summary = text
                .split("| whole run")
                .nth(1)
                .unwrap_or_else(|| panic!("no whole-run table: {text}"));
            assert!(
                summary
                    .lines()
                    .any(|l| l.contains(&local) && l.contains("client*")),
                "closed flow {local} in the whole-run table: {text}"
            );
        }
    }
}

/// A request/response server that waits `delay` before each reply (this
/// kernel has no netem: the RTT the client's TCP measures then includes the
/// delay, as its request is ACKed by the reply). One connection at a time.
struct DelayedServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl DelayedServer {
    fn start(ns: &NetNs, addr: SocketAddr, delay: Duration) -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = ns.spawn(move || {
            let l = std::net::TcpListener::bind(addr).unwrap();
            l.set_nonblocking(true).unwrap();
            tx.send(()).unwrap();
            while !stop2.load(Relaxed) {
                let Ok((mut s, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_nodelay(true).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let mut b = [0u8; 1];
                while !stop2.load(Relaxed) {
                    match s.read(&mut b) {
                        Ok(0) => break,
                        Ok(_) => {
                            std::thread::sleep(delay);
                            if s.write_all(b"rr").is_err() {
                                break;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break,
                    }
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("delayed server did not start");
        DelayedServer {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for DelayedServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Exact nearest-rank percentile (the smallest sample with at least p% of
/// the samples at or below it) of sorted samples.
fn nearest_rank(sorted: &[u32], p: f64) -> f64 {
    let rank = ((p / 100.0 * sorted.len() as f64) - 1e-9).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64
}

/// Every percentile (and min/max) of `stats` against the exact ones of
/// `samples`: failures (with both values) are pushed to `bad`; returns the
/// worst relative error.
fn check_stats(
    what: &str,
    stats: &serde_json::Value,
    samples: &[u32],
    bad: &mut Vec<String>,
) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let mut worst: f64 = 0.0;
    for (key, p) in [
        ("min_us", 0.0),
        ("p50_us", 50.0),
        ("p90_us", 90.0),
        ("p99_us", 99.0),
        ("max_us", 100.0),
    ] {
        let exact = nearest_rank(&sorted, p);
        let got = stats[key].as_f64().unwrap_or(f64::NAN);
        let err = (got - exact).abs() / exact.max(1.0);
        worst = worst.max(err);
        if err.is_nan() || err > 0.01 {
            bad.push(format!(
                "{what}: {key} reported {got:.1} us, exact {exact} us ({:.2}% off, n {})",
                100.0 * err,
                samples.len()
            ));
        }
    }
    worst
}

/// Raw samples (`--raw`) per (view, netns, local, remote), in time order.
fn raw_by_flow(
    lines: &[serde_json::Value],
) -> std::collections::HashMap<(String, u64, String, String), Vec<u32>> {
    let mut m: std::collections::HashMap<_, Vec<(f64, u32)>> = std::collections::HashMap::new();
    for l in lines.iter().filter(|l| l["type"] == "sample") {
        let key = (
            l["view"].as_str().unwrap().to_string(),
            l["netns"].as_u64().unwrap(),
            l["local"].as_str().unwrap().to_string(),
            l["remote"].as_str().unwrap().to_string(),
        );
        m.entry(key).or_default().push((
            l["t"].as_f64().unwrap(),
            l["rtt_us"].as_u64().unwrap() as u32,
        ));
    }
    m.into_iter()
        .map(|(k, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            (k, v.into_iter().map(|s| s.1).collect())
        })
        .collect()
}

/// Percentile precision (issue 15): a paced request/response flow with a
/// few ms of RTT on both sides (the server waits 3 ms before each reply, the
/// client 5 ms before each request: the server's TCP times the client's
/// pause, delayed ACK), observed by both views with `--raw`. Every
/// percentile of every interval row and of the end record is within 1% of
/// the exact nearest-rank percentile of the raw samples of the same interval
/// (a flow's samples are added in time order, so an interval row's n samples
/// are the next n raw samples of that flow) or of the whole run.
#[test]
fn percentiles_are_within_one_percent_of_the_raw_samples() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5004").parse().unwrap();
    let _srv = DelayedServer::start(&p.b, server, Duration::from_millis(3));
    let lines = observe_raw_over_delayed_rr(&p, server);
    let end = lines
        .iter()
        .find(|l| l["type"] == "end")
        .expect("end record");
    for (view, dropped) in [
        ("tcp", "raw_events_dropped"),
        ("sampler", "raw_events_dropped"),
    ] {
        assert_eq!(end["counters"][view][dropped], 0, "raw samples lost: {end}");
    }
    let raw = raw_by_flow(&lines);
    let (mut bad, mut checked) = (Vec::new(), Vec::new());
    let worst = check_intervals_against_raw(&lines, &raw, &mut bad, &mut checked);
    let worst = worst.max(check_end_against_raw(end, &raw, &mut bad, &mut checked));
    println!(
        "worst relative error {:.3}% over {} rows: {checked:?}",
        100.0 * worst,
        checked.len()
    );
    assert!(
        bad.is_empty(),
        "{} percentiles off by more than 1%:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert_the_scenario_happened(&checked);
}

/// Raw samples by (view, netns, local, remote), as [`raw_by_flow`] gives them.
type RawByFlow = std::collections::HashMap<(String, u64, String, String), Vec<u32>>;

/// A checked row: what, its sample count, its p50 (us).
type Checked = (String, u64, f64);

/// A flow's key among the raw samples.
fn raw_key(view: &str, f: &serde_json::Value) -> (String, u64, String, String) {
    (
        view.to_string(),
        f["netns"].as_u64().unwrap(),
        f["local"].as_str().unwrap().to_string(),
        f["remote"].as_str().unwrap().to_string(),
    )
}

/// `observe --raw --view tcp,sampler` on both ends for 5 s, 3.3 s of RR traffic to `server`
/// (paused before the observer ends: the end record sees every raw sample): its JSON lines.
fn observe_raw_over_delayed_rr(p: &Pair, server: SocketAddr) -> Vec<serde_json::Value> {
    let (ia, ib) = (
        format!("{}:{}", p.a.name, p.a_if),
        format!("{}:{}", p.b.name, p.b_if),
    );
    let path = std::env::temp_dir().join(unique("rtspct"));
    let mut cmd = Command::new(rttscope_bin());
    cmd.args([
        "observe",
        "--format",
        "json",
        "--raw",
        "--view",
        "tcp,sampler",
    ])
    .args([
        "--netns", &p.a.name, "--netns", &p.b.name, "--iface", &ia, "--iface", &ib,
    ])
    .args(["--interval", "1s", "--duration", "5s"])
    .stdout(std::fs::File::create(&path).unwrap());
    let obs = ChildGuard(Some(
        cmd.stderr(std::process::Stdio::piped()).spawn().unwrap(),
    ));
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&path)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "observer did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(3300));
    cli.pause(); // quiet before the observer ends: the end record sees every raw sample
    let out = obs.wait_output(Duration::from_secs(30)).unwrap();
    drop(cli);
    let stdout = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_lines(&stdout).unwrap()
}

/// Each interval's rows against the raw samples of its stretch: the worst relative error.
fn check_intervals_against_raw(
    lines: &[serde_json::Value],
    raw: &RawByFlow,
    bad: &mut Vec<String>,
    checked: &mut Vec<Checked>,
) -> f64 {
    let mut next: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    let mut worst = 0.0f64;
    for (i, iv) in lines.iter().filter(|l| l["type"] == "interval").enumerate() {
        for f in iv["flows"].as_array().unwrap() {
            for view in ["tcp", "sampler"] {
                let Some(n) = f[view]["n"].as_u64().filter(|&n| n > 0) else {
                    continue;
                };
                let k = raw_key(view, f);
                let all = raw.get(&k).map_or(&[][..], |v| &v[..]);
                let from = *next.get(&k).unwrap_or(&0);
                let to = from + n as usize;
                assert!(
                    to <= all.len(),
                    "interval {i} {k:?}: n {n} but only {} raw samples left",
                    all.len() - from
                );
                next.insert(k.clone(), to);
                let what = format!("interval {i} {view} {} {}", f["side"], f["local"]);
                worst = worst.max(check_stats(&what, &f[view], &all[from..to], bad));
                checked.push((what, n, f[view]["p50_us"].as_f64().unwrap()));
            }
        }
    }
    worst
}

/// The end record's summaries against all raw samples: the worst relative error.
fn check_end_against_raw(
    end: &serde_json::Value,
    raw: &RawByFlow,
    bad: &mut Vec<String>,
    checked: &mut Vec<Checked>,
) -> f64 {
    let mut worst = 0.0f64;
    for f in end["flows"].as_array().unwrap() {
        for view in ["tcp", "sampler"] {
            let Some(s) = f[view]["summary"].as_object() else {
                continue;
            };
            let k = raw_key(view, f);
            let all = raw.get(&k).map_or(&[][..], |v| &v[..]);
            assert_eq!(
                s["n"].as_u64().unwrap() as usize,
                all.len(),
                "end {k:?}: n vs raw samples"
            );
            let what = format!("end {view} {} {}", f["side"], f["local"]);
            worst = worst.max(check_stats(&what, &f[view]["summary"], all, bad));
            checked.push((
                what,
                s["n"].as_u64().unwrap(),
                s["p50_us"].as_f64().unwrap(),
            ));
        }
    }
    worst
}

/// The scenario happened: both views, both sides, a few ms, enough samples.
fn assert_the_scenario_happened(checked: &[Checked]) {
    for view in ["tcp", "sampler"] {
        for side in ["client", "server"] {
            let rows: Vec<_> = checked
                .iter()
                .filter(|c| c.0.starts_with("interval") && c.0.contains(view) && c.0.contains(side))
                .collect();
            let full = rows
                .iter()
                .filter(|r| r.1 >= 50 && r.2 > 2_000.0 && r.2 < 10_000.0)
                .count();
            assert!(
                full >= 2,
                "{view} {side}: expected 2+ intervals of 50+ samples at a few ms: {rows:?}"
            );
        }
    }
}

/// Kernel memory of the maps of a process, from /proc/PID/fdinfo (what
/// `bpftool map show` prints as memlock): (total bytes, one line per map).
fn maps_memlock(pid: u32) -> (u64, Vec<String>) {
    let mut seen = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        if let (Some(id), Some(mem)) = (field("map_id:"), field("memlock:")) {
            let desc = format!(
                "map {id}: type {} value {} B x {} entries: {mem} B",
                field("map_type:").unwrap_or_default(),
                field("value_size:").unwrap_or_default(),
                field("max_entries:").unwrap_or_default()
            );
            seen.insert(id, (mem.parse::<u64>().unwrap_or(0), desc));
        }
    }
    let total = seen.values().map(|v| v.0).sum();
    (total, seen.into_values().map(|v| v.1).collect())
}

/// Issue 28.1: one `observe --view tcp,sampler` at its defaults (16,384
/// flows per view) holds at most 32 MiB of kernel maps (168 MiB when each
/// flow had its own 5 KiB histogram), and a flow entry is at most 1 KiB.
#[test]
fn both_views_at_their_defaults_hold_at_most_32_mib_of_kernel_maps() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--view", "tcp,sampler", "--netns", &p.a.name])
        .args(["--iface", &ia, "--duration", "20s", "--format", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut obs = ChildGuard(Some(cmd.spawn().unwrap()));
    let pid = obs.pid();
    // the start record is written once everything is attached
    let mut out = std::io::BufReader::new(obs.0.as_mut().unwrap().stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    assert!(first.contains("\"start\""), "no start record: {first:?}");
    let (total, maps) = maps_memlock(pid);
    let mib = total as f64 / (1 << 20) as f64;
    println!("kernel maps: {mib:.2} MiB\n{}", maps.join("\n"));
    assert!(
        total <= 32 << 20,
        "kernel maps of observe --view tcp,sampler at the defaults: {mib:.2} MiB > 32 MiB:\n{}",
        maps.join("\n")
    );
    let tcp = std::mem::size_of::<rttscope::bpf::TcpFlow>();
    let way = std::mem::size_of::<rttscope::bpf::sampler::types::rttscope_sampler_entry>();
    assert!(
        tcp <= 1024 && way <= 1024,
        "flow entries: TCP {tcp} B, sampler {way} B"
    );
}
