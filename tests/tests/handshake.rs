//! Handshake times, both ends, and failed handshakes by kind (issue 45 item 3), under both
//! loaders, on the lab's emulated path (10 ms each way: a 20 ms RTT; the lab's NFQUEUE
//! emulator, this kernel has no netem).
//!
//! Traffic: `rttscope probe tcp-connect` from the client namespace (a handshake, then a FIN;
//! it times each handshake by the client kernel's `tcpi_rtt`, read with getsockopt) to `rttscope serve` in the server
//! namespace; `observe` watches both namespaces. Truths: the configured delay, the probe's own
//! timing of the same handshakes, the number of handshakes the probe made.
//!
//! Tolerances: each side's median handshake RTT within 5 % (1 ms) of the configured 20 ms — the
//! emulator adds 0.1-0.3 ms of its own, and one stalled handshake on this loaded machine moves a
//! median little — and not above the probe's median + 5 % (the client side is the same kernel
//! sample read two ways, sock_ops and getsockopt; when the probe timed connect() to writable in
//! userspace, its wake-up on this loaded machine added 1.6 to 7.7 ms to its median in one run
//! while the kernel's stayed at 20.3 ms); no handshake shorter than the
//! configured delay (less would mean a wrong measurement, not load). With timestamps off on
//! the client (a second batch, to another port) the same: the kernel times the SYN and the
//! SYN-ACK from when it sent them, not from a timestamp echo. Counts are exact: the test's
//! namespaces and ports see only its own connections.
use std::net::TcpStream;
use std::time::Duration;

use rttscope::lab::emulator::{Impairment, LinkConfig};
use rttscope::lab::testbed::{Role, Testbed, SRV_ADDR};
use rttscope_e2e::{observe_json_attached, require_root, rttscope_bin};
use serde_json::Value;

/// `rttscope serve` answers here (timestamps on).
const OPEN: u16 = 7878;
/// A second `rttscope serve`: the batch with timestamps off on the client.
const OPEN_NO_TS: u16 = 7879;
/// Nothing listens here: refused.
const CLOSED: u16 = 7001;
/// SYNs to this port are dropped by the server's firewall: timed out.
const SILENT: u16 = 7002;
const N: usize = 20;
const N_NO_TS: usize = 10;
const RTT_US: f64 = 20_000.0;

/// `rttscope probe tcp-connect ARGS` from the client namespace; its output and its median (ms).
fn probe(tb: &Testbed, port: u16, args: &[&str]) -> (String, f64) {
    let file = std::env::temp_dir()
        .join(rttscope_e2e::unique("hsprobe"))
        .with_extension("json");
    let bin = rttscope_bin();
    let o = tb
        .command(Role::Cli, bin.to_str().unwrap())
        .args(["probe", "tcp-connect", &format!("{SRV_ADDR}:{port}")])
        .args(args)
        .arg("--json")
        .arg(&file)
        .output()
        .unwrap();
    let doc: Value = std::fs::read_to_string(&file)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&file);
    let p50 = doc["views"][0]["summary"]["p50_us"]
        .as_f64()
        .unwrap_or(f64::NAN)
        / 1e3;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (text, p50)
}

fn sh_in(tb: &Testbed, role: Role, args: &[&str]) {
    let o = tb.command(role, args[0]).args(&args[1..]).output().unwrap();
    assert!(o.status.success(), "{args:?}: {o:?}");
}

/// The testbed with its 20 ms path, the two responders, the server's firewall (SYNs to
/// `SILENT` dropped) and one SYN retry on the client (a dropped SYN times out in ~3 s).
fn setup() -> (Testbed, Impairment) {
    let tb = Testbed::new().unwrap();
    let mut imp = Impairment::new(&tb).unwrap();
    imp.set_both(LinkConfig::delay(Duration::from_millis(10)))
        .unwrap();
    let bin = rttscope_bin();
    for port in [OPEN, OPEN_NO_TS] {
        let listen = format!("{SRV_ADDR}:{port}");
        tb.spawn(
            Role::Srv,
            &[bin.to_str().unwrap(), "serve", "--listen", &listen],
        )
        .unwrap();
    }
    for rule in [
        "add table inet rths",
        "add chain inet rths in { type filter hook input priority 0 ; }",
        &format!("add rule inet rths in tcp dport {SILENT} drop"),
    ] {
        let mut args = vec!["nft"];
        args.extend(rule.split(' '));
        sh_in(&tb, Role::Srv, &args);
    }
    sh_in(
        &tb,
        Role::Cli,
        &["sysctl", "-qw", "net.ipv4.tcp_syn_retries=1"],
    );
    std::thread::sleep(Duration::from_millis(500));
    (tb, imp)
}

/// The end record's flows to or from `port` on `side` whose client port is (`want`) or is not
/// `client_port`: their handshake RTTs (us), and how many had none.
fn handshakes(
    end: &Value,
    port: u16,
    side: &str,
    (client_port, want): (u16, bool),
) -> (Vec<f64>, usize) {
    let mut v = Vec::new();
    let mut none = 0;
    let suffix = format!(":{port}");
    for f in end["flows"].as_array().into_iter().flatten() {
        let (server_end, client_end) = match side {
            "server" => (&f["local"], &f["remote"]),
            _ => (&f["remote"], &f["local"]),
        };
        let cport = format!(":{client_port}");
        let ours = f["side"] == side
            && server_end.as_str().is_some_and(|a| a.ends_with(&suffix))
            && client_end.as_str().is_some_and(|a| a.ends_with(&cport)) == want;
        if !ours {
            continue;
        }
        match f["tcp"]["handshake_us"].as_f64() {
            Some(us) => v.push(us),
            None => none += 1,
        }
    }
    v.sort_by(f64::total_cmp);
    (v, none)
}

/// Each side's handshakes to `port`: `n` of them, median within 5 % of the configured RTT and of
/// the probe's median, none below the configured RTT.
fn check_side(
    end: &Value,
    (port, before): (u16, u16),
    n: usize,
    probe_ms: f64,
    what: &str,
) -> Vec<String> {
    let mut bad = Vec::new();
    for side in ["client", "server"] {
        let (v, none) = handshakes(end, port, side, (before, false));
        let p50 = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
        eprintln!(
            "{what} {side}: {} handshakes (+{none} without), median {p50:.0} us, min {:.0}, max {:.0}; probe median {probe_ms:.3} ms",
            v.len(),
            v.first().unwrap_or(&f64::NAN),
            v.last().unwrap_or(&f64::NAN)
        );
        if v.len() != n || none != 0 {
            bad.push(format!(
                "{what} {side}: {} handshakes, {none} without, {n} made",
                v.len()
            ));
        }
        // the probe reads the client kernel's sample (tcpi_rtt); the server's is no longer
        if (p50 - RTT_US).abs() > 0.05 * RTT_US || p50 > 1.05 * probe_ms * 1e3 {
            bad.push(format!(
                "{what} {side}: median {p50:.0} us, configured {RTT_US} us, probe {probe_ms:.3} ms"
            ));
        }
        if v.first().is_some_and(|&m| m < RTT_US - 100.0) {
            bad.push(format!(
                "{what} {side}: a handshake of {:.0} us, below the configured RTT",
                v[0]
            ));
        }
    }
    bad
}

/// The handshakes of every interval and of the end record against the handshakes made, the
/// connection opened before attach (client port `bport`: both ends, neither with a handshake)
/// and the failure counters (one refused, one timed out with its SYN sent again).
fn check_counts(lines: &[Value], end: &Value, bport: u16) -> Vec<String> {
    let mut bad = Vec::new();
    let c = &end["counters"]["tcp"];
    // every interval's handshakes add up to the handshakes made, as does the end record's
    for side in ["client", "server"] {
        let per_iv: u64 = lines
            .iter()
            .filter(|l| l["type"] == "interval")
            .filter_map(|l| l["handshakes"]["tcp"][side]["n"].as_u64())
            .sum();
        let whole = end["handshakes"]["tcp"][side]["summary"]["n"].as_u64();
        if per_iv != (N + N_NO_TS) as u64 || whole != Some(per_iv) {
            bad.push(format!(
                "{side}: intervals' handshakes {per_iv}, end record's {whole:?}, {} made",
                N + N_NO_TS
            ));
        }
    }
    // the connection opened before: both ends found, neither with a handshake
    let ends: Vec<(Vec<f64>, usize)> = ["client", "server"]
        .iter()
        .map(|s| handshakes(end, OPEN, s, (bport, true)))
        .collect();
    let before_ok = ends.iter().all(|(v, none)| v.is_empty() && *none == 1);
    let want = [
        ("handshake_failed_refused", 1),
        ("handshake_failed_timed_out", 1),
        ("handshake_failed_reset", 0),
        ("handshake_failed_abandoned", 0),
        ("handshake_not_measured", 0),
    ];
    for (k, n) in want {
        if c[k].as_u64() != Some(n) {
            bad.push(format!("{k} {} (want {n})", c[k]));
        }
    }
    if c["handshake_syn_retransmits"].as_u64() < Some(1) {
        bad.push(format!(
            "handshake_syn_retransmits {} (the dropped SYN was sent again)",
            c["handshake_syn_retransmits"]
        ));
    }
    if c["handshakes_before_attach"].as_u64() != Some(2) || !before_ok {
        bad.push(format!("handshakes_before_attach {} (the connection opened before: both ends), its flows {ends:?}", c["handshakes_before_attach"]));
    }
    bad
}

fn handshakes_and_failures(loader: &str) {
    let (tb, imp) = setup();
    // a connection open before observe starts: no handshake, said so
    let before = tb
        .run_in(Role::Cli, || TcpStream::connect((SRV_ADDR, OPEN)).unwrap())
        .unwrap();
    let bport = before.local_addr().unwrap().port();
    let ports: Vec<String> = [OPEN, OPEN_NO_TS, CLOSED, SILENT]
        .iter()
        .map(|p| p.to_string())
        .collect();
    let mut args: Vec<String> = [
        "--loader",
        loader,
        "--netns",
        &tb.ns(Role::Cli),
        "--netns",
        &tb.ns(Role::Srv),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in &ports {
        args.extend(["--port".to_string(), p.clone()]);
    }
    args.extend(["--interval", "1s", "--duration", "12s"].map(String::from));
    let obs = observe_json_attached(args, Duration::from_secs(120));
    let (out, probe_ms) = probe(&tb, OPEN, &["-c", &N.to_string(), "-i", "0.05", "-q"]);
    sh_in(
        &tb,
        Role::Cli,
        &["sysctl", "-qw", "net.ipv4.tcp_timestamps=0"],
    );
    let (out2, probe_no_ts) = probe(
        &tb,
        OPEN_NO_TS,
        &["-c", &N_NO_TS.to_string(), "-i", "0.05", "-q"],
    );
    sh_in(
        &tb,
        Role::Cli,
        &["sysctl", "-qw", "net.ipv4.tcp_timestamps=1"],
    );
    let (refused, _) = probe(&tb, CLOSED, &["-c", "1"]);
    let (silent, _) = probe(&tb, SILENT, &["-c", "1", "-W", "6"]);
    let lines = obs.join().unwrap().unwrap();
    drop(before);
    drop(imp);
    let end = lines
        .iter()
        .find(|l| l["type"] == "end")
        .expect("an end record");
    let c = &end["counters"]["tcp"];
    let mut bad = check_side(end, (OPEN, bport), N, probe_ms, "timestamps on");
    bad.extend(check_side(
        end,
        (OPEN_NO_TS, bport),
        N_NO_TS,
        probe_no_ts,
        "timestamps off",
    ));
    bad.extend(check_counts(&lines, end, bport));
    assert!(
        bad.is_empty(),
        "{loader}: {}\ncounters {c}\nprobe: {out}\n{out2}\n{refused}\n{silent}",
        bad.join("\n")
    );
}

#[test]
fn handshake_times_and_failures_libbpf() {
    if require_root() {
        handshakes_and_failures("libbpf");
    }
}

#[test]
fn handshake_times_and_failures_aya() {
    if require_root() {
        handshakes_and_failures("aya");
    }
}
