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
    // a second interface in namespace a: another veth pair to b, up, with an address
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
    let server: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let i1 = format!("{}:{}", p.a.name, p.a_if);
    let i2 = format!("{}:{}", p.a.name, if2);
    let mut cmd = std::process::Command::new(rttscope_bin());
    cmd.args([
        "observe",
        "--view",
        "tcp,sampler",
        "--netns",
        &p.a.name,
        "--iface",
        &i1,
        "--iface",
        &i2,
        "--format",
        "json",
        "--interval",
        "300ms",
        "--duration",
        "4s",
    ]);
    let child = ChildGuard::spawn(&mut cmd).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    p.a.exec(&["ip", "link", "del", &if2]).unwrap();
    let out = child.wait_output(Duration::from_secs(30)).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "observe failed: {stderr}");
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rttscope: notice:"))
        .collect();
    assert_eq!(notices.len(), 1, "one notice expected: {stderr}");
    assert!(
        notices[0].contains(&format!("interface {i2} is gone")),
        "{stderr}"
    );
    assert!(!stderr.contains(&p.a_if), "if1 is not mentioned: {stderr}");
    let lines = parse_lines(&out.stdout).unwrap();
    let ivs: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    assert!(
        ivs.len() >= 10,
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
    // the client flow's sampler samples (on if1) keep coming after the deletion
    let local = cli.local.to_string();
    let sampled = |iv: &serde_json::Value| -> u64 {
        iv["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["local"] == local.as_str())
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
#[test]
fn closed_flows_are_in_the_whole_run_summary() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5003").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
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
            // one RTT sample per completed transaction on the client (+- a few)
            assert!(
                n + 5 >= transactions && n <= transactions + 5,
                "whole-run n {n} vs {transactions} transactions: {f}"
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
