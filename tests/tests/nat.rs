//! One connection through NAT, one row (issue 45 item 1): a client reaches its server through a
//! DNAT in the output hook (a ClusterIP as kube-proxy makes it) or leaves through SNAT
//! (masquerade) in its own namespace; the TCP view sees the socket's tuple, the sampler on the
//! client's interface the translated one. `observe` joins them through the namespace's
//! conntrack: one row per connection with both views and the side known, in the JSON records
//! and in /metrics (the remote label is the address the socket connected to), on a busy host.
//! Truth: the addresses the test configured, the transactions its clients counted.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rttscope_e2e::busy::{BusyHost, Responder};
use rttscope_e2e::*;
use serde_json::Value;

const BACKEND_PORT: u16 = 7001;

/// How the test's connections are translated.
#[derive(Clone, Copy, Debug)]
enum Nat {
    /// `-t nat -A OUTPUT -d SERVICE -p tcp --dport 80 -j DNAT --to-destination BACKEND`.
    DnatOutput,
    /// The client bound to an address of its own, masqueraded to the interface's on the way out.
    Masquerade,
}

struct Fam {
    v6: bool,
}

impl Fam {
    fn tables(&self) -> &'static str {
        if self.v6 {
            "ip6tables"
        } else {
            "iptables"
        }
    }
    fn addr(&self, v4: &str, v6: &str, port: u16) -> SocketAddr {
        let ip = if self.v6 { v6 } else { v4 };
        SocketAddr::new(ip.parse().unwrap(), port)
    }
    fn backend(&self) -> SocketAddr {
        self.addr(B_ADDR, B_ADDR6, BACKEND_PORT)
    }
    fn service(&self) -> SocketAddr {
        self.addr("10.100.0.10", "fd00:100::10", 80)
    }
    /// The client's own address before masquerade.
    fn inner(&self) -> SocketAddr {
        self.addr("10.76.0.1", "fd76::1", 0)
    }
    fn host_len(&self) -> &'static str {
        if self.v6 {
            "128"
        } else {
            "32"
        }
    }
}

/// The NAT rules in the client's namespace; where the client connects to and binds.
fn set_up(p: &Pair, nat: Nat, fam: &Fam) -> (SocketAddr, Option<SocketAddr>) {
    let ipt = fam.tables();
    let ip = if fam.v6 { "-6" } else { "-4" };
    match nat {
        Nat::DnatOutput => {
            let svc = fam.service();
            let to = if fam.v6 {
                format!("[{}]:{BACKEND_PORT}", fam.backend().ip())
            } else {
                fam.backend().to_string()
            };
            let dst = format!("{}/{}", svc.ip(), fam.host_len());
            p.a.exec(&["ip", ip, "route", "add", &dst, "dev", &p.a_if])
                .unwrap();
            p.a.exec(&[
                ipt,
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-d",
                &dst,
                "-p",
                "tcp",
                "--dport",
                "80",
                "-j",
                "DNAT",
                "--to-destination",
                &to,
            ])
            .unwrap();
            (svc, None)
        }
        Nat::Masquerade => {
            let inner = fam.inner();
            let a = format!("{}/{}", inner.ip(), fam.host_len());
            let mut add = vec!["ip", ip, "addr", "add", &a, "dev", "lo"];
            if fam.v6 {
                add.push("nodad");
            }
            p.a.exec(&add).unwrap();
            p.a.exec(&["ip", "link", "set", "lo", "up"]).unwrap();
            p.a.exec(&[
                ipt,
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                &p.a_if,
                "-s",
                &a,
                "-j",
                "MASQUERADE",
            ])
            .unwrap();
            (fam.backend(), Some(inner))
        }
    }
}

/// GET /metrics from inside `ns`.
fn scrape_in(ns: &NetNs, port: u16) -> String {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    ns.run(move || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .expect("scrape /metrics")
}

/// The sum of `rttscope_rtt_seconds_count` over series whose labels include all of `want`.
fn rtt_count(body: &str, want: &[(&str, &str)]) -> u64 {
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    let s = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    s.samples
        .iter()
        .filter(|x| x.metric == "rttscope_rtt_seconds_count")
        .filter(|x| want.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match x.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v as u64,
            _ => 0,
        })
        .sum()
}

/// What one run saw: its JSON lines, a scrape taken after the clients stopped, the clients'
/// sockets and transactions.
struct Run {
    lines: Vec<Value>,
    metrics: String,
    clients: Vec<(SocketAddr, u64)>,
    busy: String,
}

/// Observe namespace `a` (both views, the sampler on its interface) while two clients run
/// through the NAT: one opened before the observer (no handshake seen), one after.
fn run(nat: Nat, fam: &Fam, loader: &str, extra: &[String]) -> (Pair, Run) {
    let p = Pair::new().unwrap();
    let _srv = RrServer::start(&p.b, fam.backend(), 2).unwrap();
    let (to, bind) = set_up(&p, nat, fam);
    let busy = BusyHost::start(&p, fam.backend(), Responder::Plain { resp: 2 }).unwrap();
    let think = Duration::from_millis(5);
    let open = |paused| match bind {
        Some(b) => {
            let c = RrClient::start_bound(&p.a, b, to, 2, think).unwrap();
            if paused {
                c.pause();
            }
            c
        }
        None => RrClient::start_paused(&p.a, to, 2, think, paused).unwrap(),
    };
    let early = open(true);
    let port = prometheus::free_port();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{}", p.a.name))
        .env("RTTSCOPE_LOADER", loader)
        .arg(rttscope_bin())
        .args(["observe", "--format", "json", "--view", "tcp,sampler"])
        .args([
            "--netns",
            &p.a.name,
            "--iface",
            &format!("{}:{}", p.a.name, p.a_if),
        ])
        .args(["--interval", "500ms", "--duration", "6s"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra);
    let obs = observe_json_attached_cmd(cmd, vec![format!("{nat:?}")], Duration::from_secs(40));
    early.resume();
    let late = open(false);
    std::thread::sleep(Duration::from_millis(2500));
    early.pause();
    late.pause();
    std::thread::sleep(Duration::from_millis(1200)); // a read after the last transaction
    let metrics = scrape_in(&p.a, port);
    let clients = [&early, &late]
        .iter()
        .map(|c| (c.local, u64::from(c.transactions.load(Ordering::Relaxed))))
        .collect();
    let lines = obs.join().unwrap().unwrap();
    let busy = busy.describe();
    (
        p,
        Run {
            lines,
            metrics,
            clients,
            busy,
        },
    )
}

/// Each client's connection is one row of the end record (both views, side client, remote the
/// address it connected to, both tuples under `nat`), no row holds its translated tuple, no
/// interval row of it is of another side, and each view's samples are within the suite's
/// tolerance of its transactions (one sample per transaction: 0.9x .. 1.1x + 3).
fn check_rows(p: &Pair, r: &Run, to: SocketAddr) {
    let end = r.lines.iter().find(|l| l["type"] == "end").expect("end");
    let flows = end["flows"].as_array().unwrap();
    for (local, tx) in &r.clients {
        let ctx = format!("{local} -> {to}, {tx} transactions, {}", r.busy);
        assert!(*tx > 100, "too little traffic: {ctx}");
        let f = end_flow(&r.lines, &p.a.name, &local.to_string())
            .unwrap_or_else(|| panic!("no row for {ctx}: {flows:#?}"));
        assert_eq!(f["remote"], to.to_string(), "{ctx}: {f}");
        assert_eq!(f["side"], "client", "{ctx}: {f}");
        let nat = &f["nat"];
        assert_eq!(nat["original"]["local"], local.to_string(), "{ctx}: {f}");
        let wire = (&nat["translated"]["local"], &nat["translated"]["remote"]);
        assert!(
            wire.0.is_string() && wire != (&f["local"], &f["remote"]),
            "{ctx}: {f}"
        );
        let twins = flows
            .iter()
            .filter(|g| (&g["local"], &g["remote"]) == wire)
            .count();
        assert_eq!(
            twins, 0,
            "{ctx}: a row of its own for the wire's tuple: {flows:#?}"
        );
        for view in ["tcp", "sampler"] {
            let n = f[view]["summary"]["n"].as_u64().unwrap_or(0);
            eprintln!("{local}: {view} {n} samples, {tx} transactions");
            let (lo, hi) = (tx * 9 / 10, tx * 11 / 10 + 3);
            assert!(
                (lo..=hi).contains(&n),
                "{ctx}: {view} {n} samples, expected {lo}..={hi}: {f}"
            );
        }
        for iv in r.lines.iter().filter(|l| l["type"] == "interval") {
            for row in iv["flows"].as_array().unwrap() {
                let mine =
                    row["local"] == local.to_string() || (&row["local"], &row["remote"]) == wire;
                assert!(!mine || row["side"] == "client", "{ctx}: {row}");
            }
        }
    }
    let c = last_interval_counters(&r.lines, "sampler");
    assert!(c["nat_translated"].as_u64() >= Some(2), "{c}");
    assert_eq!(c["nat_lookup_errors"], 0, "{c}");
}

/// /metrics: no sampler series of side unknown, and the sampler's samples of the clients'
/// connections under the remote prefix of the address they connected to.
fn check_metrics(r: &Run, to: SocketAddr, prefix: &str) {
    let unknown = rtt_count(&r.metrics, &[("view", "sampler"), ("side", "unknown")]);
    assert_eq!(
        unknown, 0,
        "sampler samples of side unknown in /metrics:\n{}",
        r.metrics
    );
    let tx: u64 = r.clients.iter().map(|c| c.1).sum();
    let want = [
        ("view", "sampler"),
        ("side", "client"),
        ("remote_prefix", prefix),
    ];
    let n = rtt_count(&r.metrics, &want);
    if to.port() == 80 {
        // only the test's clients connect to the service: their samples alone
        let (lo, hi) = (tx * 9 / 10, tx * 11 / 10 + 6);
        assert!(
            (lo..=hi).contains(&n),
            "{n} sampler samples under {prefix}, {tx} transactions (expected {lo}..={hi}):\n{}",
            r.metrics
        );
    } else {
        assert!(
            n >= tx * 9 / 10,
            "{n} sampler samples under {prefix}, {tx} transactions"
        );
    }
}

fn nat_case(nat: Nat, v6: bool, loader: &str) {
    if !require_root() {
        return;
    }
    let fam = Fam { v6 };
    let (p, r) = run(nat, &fam, loader, &[]);
    let to = match nat {
        Nat::DnatOutput => fam.service(),
        Nat::Masquerade => fam.backend(),
    };
    eprintln!(
        "{nat:?} v6={v6} {loader}: clients {:?}; {}",
        r.clients, r.busy
    );
    check_rows(&p, &r, to);
    let prefix = match (nat, v6) {
        (Nat::DnatOutput, false) => "10.100.0.0/24",
        (Nat::DnatOutput, true) => "fd00:100::/48",
        (Nat::Masquerade, false) => "10.77.0.0/24",
        (Nat::Masquerade, true) => "fd77::/48",
    };
    check_metrics(&r, to, prefix);
}

/// The DNAT'd service named from a names file (issue 45 item 2), the backend as a label: the
/// end row and the sampler's series carry `payments`; the busy host's direct connections to the
/// backend (no entry covers them) keep their prefix label alone.
#[test]
fn dnat_in_output_v4_is_one_row_libbpf_and_named() {
    if !require_root() {
        return;
    }
    let fam = Fam { v6: false };
    let names = std::env::temp_dir().join(format!("{}.names", unique("rtsnames")));
    std::fs::write(&names, "# the test's service\n10.100.0.0/16:80 payments\n").unwrap();
    let extra = ["--names".to_string(), names.display().to_string()];
    let extra = [&extra[..], &["--label-backend".to_string()]].concat();
    let (p, r) = run(Nat::DnatOutput, &fam, "libbpf", &extra);
    let _ = std::fs::remove_file(&names);
    check_rows(&p, &r, fam.service());
    check_metrics(&r, fam.service(), "10.100.0.0/24");
    for (local, _) in &r.clients {
        let f = end_flow(&r.lines, &p.a.name, &local.to_string()).unwrap();
        assert_eq!(f["remote_name"], "payments", "{f}");
    }
    let tx: u64 = r.clients.iter().map(|c| c.1).sum();
    let named = [("view", "sampler"), ("remote_name", "payments")];
    let named = rtt_count(
        &r.metrics,
        &[&named[..], &[("backend_prefix", "10.77.0.0/24")]].concat(),
    );
    assert!(
        named >= tx * 9 / 10,
        "{named} named sampler samples for {tx} transactions:\n{}",
        r.metrics
    );
    // the direct connections to the backend: samples, no name, no backend
    let body = r
        .metrics
        .split_once("\r\n\r\n")
        .map_or(&r.metrics[..], |(_, b)| b);
    let direct: Vec<&str> = body
        .lines()
        .filter(|l| {
            l.starts_with("rttscope_rtt_seconds_count{")
                && l.contains("remote_prefix=\"10.77.0.0/24\"")
        })
        .collect();
    assert!(
        !direct.is_empty(),
        "no series of the direct connections:\n{body}"
    );
    for l in direct {
        assert!(
            !l.contains("remote_name=") && !l.contains("backend_prefix="),
            "{l}"
        );
    }
    assert!(body.contains("rttscope_names_entries 1"), "{body}");
}

#[test]
fn dnat_in_output_v4_is_one_row_aya() {
    nat_case(Nat::DnatOutput, false, "aya");
}

#[test]
fn dnat_in_output_v6_is_one_row() {
    nat_case(Nat::DnatOutput, true, "libbpf");
}

#[test]
fn masquerade_v4_is_one_row() {
    nat_case(Nat::Masquerade, false, "libbpf");
}

#[test]
fn masquerade_v6_is_one_row() {
    nat_case(Nat::Masquerade, true, "aya");
}
