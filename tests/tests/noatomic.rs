//! The views' builds without BPF atomics that return a value
//! (`tcp_noatomic.bpf.o`, `sampler_noatomic.bpf.o`: what kernels < 5.12 load,
//! docs/kernels.md), forced on this kernel with `RTTSCOPE_BPF_ATOMICS=off`, so
//! that they are tested on every run and not only in a 5.10 guest. Truths:
//! `ss -ti` (the kernel's srtt), and the atomics build observing the very same
//! connections at the same time (the TCP view: both get every RTT callback,
//! the same samples, so the same counts and the same histogram percentiles;
//! the sampler: both see every packet, so the same samples, each RTT read
//! from its own clock a few microseconds apart).
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use rttscope_e2e::*;

const PORT: u16 = 5021;

fn server_addr() -> SocketAddr {
    format!("{B_ADDR}:{PORT}").parse().unwrap()
}

/// `rttscope observe --format json` on both ends of the pair, the atomics
/// build or not, on a thread; `started` gets a message once its start record
/// is out (the programs are attached).
fn observe(
    p: &Pair,
    atomics: bool,
    extra: &[&str],
    started: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<anyhow::Result<Vec<serde_json::Value>>> {
    use std::io::BufRead;
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--format", "json"]);
    for ns in [&p.a, &p.b] {
        cmd.args(["--netns", &ns.name]);
    }
    cmd.args(extra);
    if !atomics {
        cmd.env("RTTSCOPE_BPF_ATOMICS", "off");
    }
    std::thread::spawn(move || {
        let mut guard = ChildGuard::spawn(&mut cmd)?;
        let stdout = guard.0.as_mut().and_then(|c| c.stdout.take());
        let mut text = String::new();
        if let Some(out) = stdout {
            let mut r = std::io::BufReader::new(out);
            r.read_line(&mut text)?;
            let _ = started.send(());
            std::io::Read::read_to_string(&mut r, &mut text)?;
        }
        let out = guard.wait_output(Duration::from_secs(60))?;
        anyhow::ensure!(
            out.status.success(),
            "rttscope observe (atomics: {atomics}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_lines(text.as_bytes())
    })
}

fn flow<'a>(lines: &'a [serde_json::Value], ns: &str, local: &str) -> &'a serde_json::Value {
    &end_flow(lines, ns, local)
        .unwrap_or_else(|| panic!("no flow {local} in {ns} in the end line: {lines:#?}"))["tcp"]
}

/// Both builds side by side on one request/response connection: the same
/// sample count and percentiles per side, the end srtt on `ss -ti`'s; the
/// start record says which build ran and why.
#[test]
fn noatomic_build_matches_ss_and_the_atomics_build() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    // Open before the start: this build has no path for it (docs/kernels.md),
    // which must be said and counted, not left out silently.
    // (its own server port: the server flows are told apart by their address)
    let early_addr: SocketAddr = format!("{B_ADDR}:{}", PORT + 1).parse().unwrap();
    let _early_srv = RrServer::start(&p.b, early_addr, 2).unwrap();
    let early = RrClient::start_paused(&p.a, early_addr, 2, Duration::ZERO, true).unwrap();
    let args = ["--interval", "500ms", "--duration", "8s"];
    let (tx, started) = std::sync::mpsc::channel();
    let na = observe(&p, false, &args, tx.clone());
    let at = observe(&p, true, &args, tx);
    // Both attached before the connection opens: they see the same callbacks.
    for _ in 0..2 {
        started
            .recv_timeout(Duration::from_secs(30))
            .expect("both observers started");
    }
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(5)).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    cli.pause();
    std::thread::sleep(Duration::from_millis(200));
    let ss_client = ss_rtt_ms(&p.a, cli.local.port())
        .unwrap()
        .expect("client socket");
    let ss_server = ss_rtt_ms(&p.b, PORT).unwrap().expect("server socket");
    let na = na.join().unwrap().unwrap();
    let at = at.join().unwrap().unwrap();

    let start = |l: &[serde_json::Value]| l.iter().find(|r| r["type"] == "start").cloned().unwrap();
    let w = start(&na)["tcp"]["without_atomics"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        w.contains("RTTSCOPE_BPF_ATOMICS=off"),
        "start record says why: {w:?}"
    );
    assert!(
        start(&at)["tcp"].get("without_atomics").is_none(),
        "atomics build: no such key"
    );
    let (nt, at_nt) = (
        &start(&na)["tcp"]["existing_not_timed"],
        &start(&at)["tcp"]["existing_not_timed"],
    );
    assert!(
        nt.as_u64().unwrap() >= 2,
        "both ends of {} said not timed: {nt}",
        early.local
    );
    assert_eq!(at_nt, 0, "the atomics build times it");

    let local = cli.local.to_string();
    let server = server_addr().to_string();
    for (what, ns, addr, ss) in [
        ("client", &p.a.name, &local, ss_client),
        ("server", &p.b.name, &server, ss_server),
    ] {
        let (n, a) = (flow(&na, ns, addr), flow(&at, ns, addr));
        let ours = n["srtt_us"].as_f64().unwrap() / 1000.0;
        let tol = (0.2 * ss).max(0.050);
        assert!(
            (ours - ss).abs() <= tol,
            "{what}: srtt {ours:.3} ms vs ss {ss:.3} ms; flow: {n}"
        );
        let count = n["summary"]["n"].as_u64().unwrap();
        assert!(count > 20, "{what}: too few samples: {n}");
        assert_eq!(n["srtt_us"], a["srtt_us"], "{what}: srtt of both builds");
        assert_eq!(
            n["summary"], a["summary"],
            "{what}: the same samples in both builds"
        );
    }
    for l in [&na, &at] {
        let c = last_interval_counters(l, "tcp");
        for k in [
            "samples_pool_overflow",
            "samples_not_binned",
            "flow_map_full",
        ] {
            if let Some(v) = c.get(k) {
                assert_eq!(v, 0, "{k}: {c}");
            }
        }
    }
}

/// The slot stack of the build without atomics: churn of three times the
/// capacity, then idle connections, then a busy one (as the TCP view's own
/// slot test): slots are taken from the stack, given back and reused, idle
/// flows evicted, and the busy flow measured.
#[test]
fn noatomic_slots_are_reused() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let (tx, started) = std::sync::mpsc::channel();
    let obs = observe(
        &p,
        false,
        &["--max-flows", "16", "--interval", "1s", "--duration", "7s"],
        tx,
    );
    started
        .recv_timeout(Duration::from_secs(30))
        .expect("observer started");
    let mut churned = Vec::new();
    for _ in 0..24 {
        let c = RrClient::start(&p.a, server_addr(), 2, Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        churned.push(c.local.to_string());
        drop(c);
    }
    std::thread::sleep(Duration::from_millis(1300));
    let idle: Vec<RrClient> = (0..10)
        .map(|_| RrClient::start_paused(&p.a, server_addr(), 2, Duration::ZERO, true).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let busy = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    let lines = obs.join().unwrap().unwrap();
    drop(idle);
    let closed: std::collections::HashSet<String> = lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["flows"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["netns_name"] == p.a.name.as_str() && f["closed"] == true)
        .filter_map(|f| f["local"].as_str().map(str::to_string))
        .collect();
    let missing: Vec<&String> = churned.iter().filter(|c| !closed.contains(*c)).collect();
    assert!(
        missing.is_empty(),
        "churned connections never reported closed: {missing:?}"
    );
    let f = flow(&lines, &p.a.name, &busy.local.to_string());
    assert!(
        f["summary"]["n"].as_u64().unwrap() > 50,
        "busy flow measured: {f}"
    );
    let c = last_interval_counters(&lines, "tcp");
    assert!(
        c["flows_evicted"].as_u64().unwrap() > 0,
        "idle flows evicted: {c}"
    );
    assert!(
        c["flows_closed_reported"].as_u64().unwrap() >= 48,
        "closes reported: {c}"
    );
}

/// `rttscope features` says which build the TCP view loads and why, in
/// the table and the JSON, with the test setting as on a 5.10 kernel.
#[test]
fn features_report_the_build_without_atomics() {
    if !require_root() {
        return;
    }
    let run = |json: bool| {
        let mut c = Command::new(rttscope_bin());
        c.arg("features").env("RTTSCOPE_BPF_ATOMICS", "off");
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(v["views"]["tcp_object"], "tcp_noatomic", "{v}");
    assert_eq!(v["views"]["sampler_object"], "sampler_noatomic", "{v}");
    assert_eq!(v["views"]["sampler_available"], true, "{v}");
    assert_eq!(v["observe_can_run"], true, "{v}");
    let text = run(false);
    assert!(
        text.lines().any(
            |l| l.starts_with("tcp view: kernel programs built without BPF atomics")
                && l.contains("RTTSCOPE_BPF_ATOMICS=off")
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("sampler view: kernel programs built without BPF atomics")
            && l.contains("bpf_spin_lock")),
        "{text}"
    );
}

/// A sampler flow's whole-run summary in the end line.
fn sampler_summary<'a>(
    lines: &'a [serde_json::Value],
    ns: &str,
    local: &str,
) -> &'a serde_json::Value {
    &end_flow(lines, ns, local)
        .unwrap_or_else(|| panic!("no flow {local} in {ns} in the end line: {lines:#?}"))["sampler"]
        ["summary"]
}

/// The sampler's two builds side by side on the same interfaces and traffic
/// (a request/response connection and ICMP echo), each build under one
/// loader and then under the other (so both loaders load both builds, and
/// the loaders are crossed too): the same number of samples per side and in
/// all, the same TCP flows, and percentiles within 3% + 20 us (each build's
/// ingress program reads its own clock, one after the other, and a value
/// near a bucket bound may land in the next 1.6% bucket); the client's
/// median within the bounds the host tests use against the TCP view's.
#[test]
fn noatomic_sampler_matches_the_atomics_sampler() {
    if !require_root() {
        return;
    }
    for (na_loader, at_loader) in [("libbpf", "aya"), ("aya", "libbpf")] {
        sampler_side_by_side(na_loader, at_loader);
    }
}

fn sampler_side_by_side(na_loader: &str, at_loader: &str) {
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let (ia, ib) = (
        format!("{}:{}", p.a.name, p.a_if),
        format!("{}:{}", p.b.name, p.b_if),
    );
    let common = [
        "--view",
        "tcp,sampler",
        "--iface",
        &ia,
        "--iface",
        &ib,
        "--interval",
        "500ms",
        "--duration",
        "7s",
    ];
    let args = |loader| [&["--loader", loader][..], &common[..]].concat();
    let (tx, started) = std::sync::mpsc::channel();
    let na = observe(&p, false, &args(na_loader), tx.clone());
    let at = observe(&p, true, &args(at_loader), tx);
    for _ in 0..2 {
        started
            .recv_timeout(Duration::from_secs(30))
            .expect("both observers started");
    }
    let cli = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    p.a.exec(&["ping", "-q", "-c", "50", "-i", "0.02", B_ADDR])
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cli.pause();
    let na = na.join().unwrap().unwrap();
    let at = at.join().unwrap().unwrap();
    let what = format!("noatomic under {na_loader}, atomics under {at_loader}");

    start_records_say_which_build(&na, &at, &what);
    let local = cli.local.to_string();
    let server = server_addr().to_string();
    for (side, ns, addr) in [
        ("client", &p.a.name, &local),
        ("server", &p.b.name, &server),
    ] {
        let tx = cli.transactions.load(std::sync::atomic::Ordering::Relaxed);
        both_builds_agree_on_a_side(&na, &at, (side, ns, addr), tx, &what);
    }
    let (cn, ca) = (
        last_interval_counters(&na, "sampler"),
        last_interval_counters(&at, "sampler"),
    );
    eprintln!("{what}: counters noatomic {cn}\natomics {ca}");
    for k in ["samples", "recorded", "icmp_egress", "icmp_ingress"] {
        assert_eq!(cn[k], ca[k], "{what}: {k} of both builds");
    }
    // 50 echo requests timed from each end (pinger and pinged): 100 samples
    // beside the TCP ones
    let tcp = |l: &[serde_json::Value]| -> u64 {
        [
            ("client", &p.a.name, &local),
            ("server", &p.b.name, &server),
        ]
        .iter()
        .map(|(_, ns, addr)| sampler_summary(l, ns, addr)["n"].as_u64().unwrap())
        .sum()
    };
    assert!(
        cn["samples"].as_u64().unwrap() >= tcp(&na) + 100,
        "{what}: the echo samples: {cn}"
    );
    for k in [
        "race",
        "flow_map_full",
        "samples_not_binned",
        "pending_map_full",
    ] {
        if let Some(v) = cn.get(k) {
            assert_eq!(v, 0, "{what}: {k}: {cn}");
        }
    }
}

/// The re-key path of the sampler's build without atomics: a table of 16
/// ways (4 sets) and 40 short connections, so that ways are evicted and
/// re-keyed under their locks while a busy connection runs: evictions
/// counted, nothing lost to a busy lock or a race, and the busy flow
/// measured (a sample per transaction, at least half of them).
#[test]
fn noatomic_sampler_evicts_and_measures() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, server_addr(), 2).unwrap();
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let (tx, started) = std::sync::mpsc::channel();
    let args = [
        "--view",
        "sampler",
        "--iface",
        &ia,
        "--max-flows",
        "16",
        "--interval",
        "1s",
        "--duration",
        "6s",
    ];
    let obs = observe(&p, false, &args, tx);
    started
        .recv_timeout(Duration::from_secs(30))
        .expect("observer started");
    let busy = RrClient::start(&p.a, server_addr(), 2, Duration::from_millis(2)).unwrap();
    for _ in 0..40 {
        let c = RrClient::start(&p.a, server_addr(), 2, Duration::ZERO).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        drop(c);
    }
    busy.pause();
    let tx = busy.transactions.load(std::sync::atomic::Ordering::Relaxed);
    let lines = obs.join().unwrap().unwrap();
    let c = last_interval_counters(&lines, "sampler");
    assert!(
        c["pending_evicted"].as_u64().unwrap() > 0,
        "ways evicted: {c}"
    );
    for k in ["race", "flow_map_full", "pending_map_full"] {
        assert_eq!(c[k], 0, "{k}: {c}");
    }
    let n = sampler_summary(&lines, &p.a.name, &busy.local.to_string())["n"]
        .as_u64()
        .unwrap();
    assert!(
        n as f64 >= 0.5 * tx as f64 && n <= u64::from(tx) + 2,
        "busy flow: {n} samples for {tx} transactions: {c}"
    );
}

/// The start record of the build without atomics says which build and why; the atomics one has no such key.
fn start_records_say_which_build(na: &[serde_json::Value], at: &[serde_json::Value], what: &str) {
    let start = |l: &[serde_json::Value]| l.iter().find(|r| r["type"] == "start").cloned().unwrap();
    let w = start(na)["sampler"]["without_atomics"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        w.contains("RTTSCOPE_BPF_ATOMICS=off") && w.contains("bpf_spin_lock"),
        "{what}: the start record says which build and why: {w:?}"
    );
    assert!(
        start(at)["sampler"].get("without_atomics").is_none(),
        "{what}: atomics build: no such key"
    );
}

/// One side of the flow: enough samples, the same ones in both builds, the same percentiles,
/// and (client) near the TCP view's.
fn both_builds_agree_on_a_side(
    na: &[serde_json::Value],
    at: &[serde_json::Value],
    (side, ns, addr): (&str, &str, &str),
    tx: u32,
    what: &str,
) {
    let (n, a) = (sampler_summary(na, ns, addr), sampler_summary(at, ns, addr));
    eprintln!("{what}: {side}: noatomic {n}; atomics {a}");
    let count = n["n"].as_u64().unwrap();
    assert!(
        count as f64 >= 0.5 * tx as f64 && count > 100,
        "{what}: {side}: too few samples ({count}, {tx} transactions)"
    );
    assert_eq!(
        n["n"], a["n"],
        "{what}: {side}: the same samples in both builds"
    );
    if side == "client" {
        // as tests/tests/observe_views.rs: the sampler misses the stack time in TCP's samples
        let tcp50 = end_flow(na, ns, addr).unwrap()["tcp"]["summary"]["p50_us"]
            .as_f64()
            .unwrap();
        let smp50 = n["p50_us"].as_f64().unwrap();
        let tol = 0.2 * tcp50 + 10.0;
        assert!(
            (smp50 - tcp50).abs() <= tol,
            "{what}: client: sampler p50 {smp50:.1} us vs TCP view p50 {tcp50:.1} us (tolerance {tol:.1} us)"
        );
    }
    for k in ["min_us", "p50_us", "p90_us", "p99_us", "max_us", "mean_us"] {
        let (x, y) = (n[k].as_f64().unwrap(), a[k].as_f64().unwrap());
        let tol = 0.03 * x.max(y) + 20.0;
        assert!(
            (x - y).abs() <= tol,
            "{what}: {side}: {k} {x:.1} us vs the atomics build's {y:.1} us (tolerance {tol:.1} us)"
        );
    }
}
