//! Issue 41.5 and 46.4: the sampler on interfaces that come and go. `--iface PREFIX*` (a
//! pattern of this test's own, `rqc<pid>x<n>a*`: it matches no other test's or the host's
//! interfaces) on the host side of veth pairs whose other ends live in namespaces made for the
//! test, as a node's pods come and go:
//!
//! - `a_pattern_follows_interfaces_as_they_come_and_go`: each new interface is attached within
//!   a second (the kernel's own tcx list, BPF_PROG_QUERY, names our program), a deleted one is
//!   released and counted, and after the exit nothing of ours is on the surviving interface;
//! - `churn_of_500_veths_and_50_namespaces`: 50 namespaces with 10 veths each, created and
//!   deleted during an observe run (sampler + TCP view `--all-netns`, `--max-ifaces 64`, up to
//!   100 veths at once), while a paced request/response flow between two other namespaces is
//!   measured on a fixed interface: its samples within the usual tolerance of its transactions;
//!   every interface created attached or refused, and counted; nothing left attached; the
//!   observer's memory and CPU within the figures in docs/metrics.md.
//!
//! Needs root. ~10 s and ~40 s.
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rttscope::sys::bpfprog;
use rttscope_e2e::observer::{unix_now, Observer};
use rttscope_e2e::{
    require_root, rss_kb, rttscope_bin, unique, NetNs, Pair, RrClient, RrServer, B_ADDR,
};
use serde_json::Value;

const PORT: u16 = 7151;

/// The test's veths: host ends `<prefix>a<i>` (what the pattern matches), other ends
/// `<prefix>b<i>` in the test's namespaces. Whatever is left is deleted on drop.
struct Veths {
    prefix: String,
}

impl Veths {
    fn new() -> Veths {
        Veths {
            prefix: unique("rqc"),
        }
    }

    fn pattern(&self) -> String {
        format!("{}a*", self.prefix)
    }

    fn host(&self, i: usize) -> String {
        format!("{}a{i}", self.prefix)
    }

    /// Create veths `range` with their other ends in `ns` (one `ip -batch`).
    fn add(&self, range: std::ops::Range<usize>, ns: &NetNs) {
        let cmds: String = range
            .map(|i| {
                format!(
                    "link add {} type veth peer name {}b{i} netns {}\n",
                    self.host(i),
                    self.prefix,
                    ns.name
                )
            })
            .collect();
        batch(&cmds);
    }

    /// Host ends of ours still there.
    fn left(&self) -> Vec<String> {
        let out = Command::new("ip").args(["-o", "link", "show"]).output();
        let text = String::from_utf8_lossy(&out.map(|o| o.stdout).unwrap_or_default()).to_string();
        text.lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with(&format!("{}a", self.prefix)))
            .collect()
    }
}

impl Drop for Veths {
    fn drop(&mut self) {
        let cmds: String = self
            .left()
            .iter()
            .map(|n| format!("link del {n}\n"))
            .collect();
        if !cmds.is_empty() {
            batch(&cmds);
        }
    }
}

/// `ip -force -batch -` with `cmds` on its input.
fn batch(cmds: &str) {
    let mut c = Command::new("ip")
        .args(["-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ip");
    c.stdin.take().unwrap().write_all(cmds.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ip -batch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tcx programs on a hook of `ifname` in the test's (host) namespace: empty if none or gone.
fn tcx_progs(ifname: &str, egress: bool) -> Vec<u32> {
    let Ok(ifindex) = nix::net::if_::if_nametoindex(ifname) else {
        return Vec::new();
    };
    let at = if egress {
        bpfprog::ATTACH_TCX_EGRESS
    } else {
        bpfprog::ATTACH_TCX_INGRESS
    };
    rttscope::sys::bpf::prog_query(ifindex, at).unwrap_or_default()
}

/// `rttscope observe --format json --interval 1s ARGS`, its start line read.
fn observe(args: &[String]) -> Observer {
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--format", "json", "--interval", "1s"])
        .args(args);
    Observer::spawn(&mut cmd, "observer")
}

fn end_counters(lines: &[Value]) -> &Value {
    let end = lines.iter().find(|l| l["type"] == "end");
    &end.unwrap_or_else(|| panic!("no end record: {lines:?}"))["counters"]["sampler"]
}

fn counter(c: &Value, name: &str) -> u64 {
    c[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {c}"))
}

/// Wait until `ifname`'s two hooks run one of `ours` (or `limit` passes): the time it took.
fn until_attached(ifname: &str, ours: &[u32], limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let on = |e| tcx_progs(ifname, e).iter().any(|id| ours.contains(id));
        if on(false) && on(true) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_pattern_follows_interfaces_as_they_come_and_go() {
    if !require_root() {
        return;
    }
    let veths = Veths::new();
    let pods = NetNs::new("rqp").unwrap();
    veths.add(0..2, &pods);
    let obs = observe(&[
        "--view".into(),
        "sampler".into(),
        "--iface".into(),
        veths.pattern(),
    ]);
    let ours = obs.sampler_prog_ids();
    let attached = obs.start["sampler"]["attached"].as_array().unwrap().len();
    assert_eq!(attached, 2, "the two matching at start: {}", obs.start);
    let mut waits = Vec::new();
    for i in 2..7 {
        veths.add(i..i + 1, &pods);
        let w = until_attached(&veths.host(i), &ours, Duration::from_secs(3));
        waits.push(w.unwrap_or_else(|| panic!("{} not attached within 3 s", veths.host(i))));
    }
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(1)),
        "attached within a second: {waits:?}"
    );
    eprintln!("attach latency: {waits:?}");
    batch(&format!(
        "link del {}\nlink del {}\n",
        veths.host(0),
        veths.host(3)
    ));
    std::thread::sleep(Duration::from_millis(1500));
    let (lines, stderr) = obs.stop();
    let c = end_counters(&lines);
    assert_eq!(counter(c, "ifaces_attached"), 7, "{c} {stderr}");
    assert_eq!(counter(c, "ifaces_released"), 2, "{c}");
    assert_eq!(counter(c, "ifaces_live"), 5, "{c}");
    assert_eq!(
        counter(c, "ifaces_refused") + counter(c, "ifaces_unattachable"),
        0,
        "{c}"
    );
    // nothing of ours on the interfaces that stay, nor anywhere: the programs are gone
    for n in veths.left() {
        for e in [false, true] {
            let left = tcx_progs(&n, e);
            assert!(left.iter().all(|id| !ours.contains(id)), "{n}: {left:?}");
        }
    }
    for id in ours {
        assert!(
            rttscope::sys::bpf::prog_name_by_id(id).is_err(),
            "program {id} still loaded"
        );
    }
}

/// The churn: `n_ns` namespaces of `per_ns` veths each (host ends matching the pattern), at
/// most `alive` namespaces at once, the oldest deleted (with its veths) to make room, all
/// deleted at the end. Returns the veths created.
fn churn(veths: &Veths, n_ns: usize, per_ns: usize, alive: usize) -> usize {
    let mut live: std::collections::VecDeque<NetNs> = Default::default();
    let mut created = 0;
    for k in 0..n_ns {
        if live.len() == alive {
            drop(live.pop_front()); // ip netns del: its veths go, the host ends with them
        }
        let ns = NetNs::new("rqn").unwrap();
        veths.add(k * per_ns..(k + 1) * per_ns, &ns);
        created += per_ns;
        live.push_back(ns);
        std::thread::sleep(Duration::from_millis(150));
    }
    drop(live);
    created
}

/// (utime + stime) of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = st.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // fields 14 and 15 of stat, 12 and 13 after the command name
    (tick(11) + tick(12)) / 100.0
}

/// Memory and CPU of the observer over the churn (docs/metrics.md, "Interfaces that come and
/// go"): what the run may use, a debug build on a loaded 2-CPU machine (measured: VmHWM
/// 37 MB, 2.7 s of CPU for 500 veths in 37 s).
const MAX_HWM_KB: u64 = 96 * 1024;
const MAX_CPU_S: f64 = 15.0;

#[test]
fn churn_of_500_veths_and_50_namespaces() {
    if !require_root() {
        return;
    }
    let pair = Pair::new().unwrap();
    let veths = Veths::new();
    let server: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let _srv = RrServer::start(&pair.b, server, 100).unwrap();
    let client = RrClient::start(&pair.a, server, 100, Duration::from_millis(10)).unwrap();
    let fixed = format!("{}:{}", pair.b.name, pair.b_if);
    let args: Vec<String> = ["--view", "tcp,sampler", "--all-netns", "--max-ifaces", "64"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--iface".into(), fixed, "--iface".into(), veths.pattern()])
        .collect();
    let obs = observe(&args);
    let (pid, ours) = (obs.child.pid(), obs.sampler_prog_ids());
    let tx0 = client.transactions.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let created = churn(&veths, 50, 10, 10);
    std::thread::sleep(Duration::from_millis(2500));
    let (hwm_kb, _) = rss_kb(pid);
    let cpu = cpu_seconds(pid);
    let took = t0.elapsed();
    // the transactions until the stop (the end record follows within milliseconds)
    let transactions = (client.transactions.load(Ordering::Relaxed) - tx0) as u64;
    let counted = Window {
        from: obs.start_seen,
        to: unix_now(),
    };
    let start_ts = obs.start["ts"].as_f64().unwrap();
    let (lines, stderr) = obs.stop();
    drop(client);
    let c = end_counters(&lines);
    let (att, refused, unatt) = (
        counter(c, "ifaces_attached"),
        counter(c, "ifaces_refused"),
        counter(c, "ifaces_unattachable"),
    );
    eprintln!(
        "churn: {created} veths in {took:?}; attached {att} (1 by name), refused {refused}, unattachable {unatt}, released {}; VmHWM {hwm_kb} kB, CPU {cpu:.2} s; {transactions} transactions",
        counter(c, "ifaces_released")
    );
    assert_eq!(
        att - 1 + refused + unatt,
        created as u64,
        "every veth counted: {c}"
    );
    assert!(
        refused > 0 && unatt == 0,
        "the bound refused some, none lost: {c} {stderr}"
    );
    assert_eq!(counter(c, "ifaces_released"), att - 1, "{c}");
    assert_eq!(
        counter(c, "ifaces_live"),
        1,
        "only the fixed one at the end: {c}"
    );
    assert_eq!(
        stderr.matches("--max-ifaces").count(),
        1,
        "said once: {stderr}"
    );
    assert_flow_timed(&lines, (transactions, counted, start_ts), &stderr);
    assert!(
        hwm_kb <= MAX_HWM_KB && cpu <= MAX_CPU_S,
        "VmHWM {hwm_kb} kB, CPU {cpu} s"
    );
    assert!(veths.left().is_empty(), "{:?}", veths.left());
    for e in [false, true] {
        let left = tcx_progs_in(&pair.b, &pair.b_if, e);
        assert!(left.iter().all(|id| !ours.contains(id)), "{left:?}");
    }
    for id in ours {
        assert!(
            rttscope::sys::bpf::prog_name_by_id(id).is_err(),
            "program {id} still loaded"
        );
    }
}

/// [`tcx_progs`] in another namespace.
fn tcx_progs_in(ns: &NetNs, ifname: &str, egress: bool) -> Vec<u32> {
    let name = ifname.to_string();
    ns.run(move || tcx_progs(&name, egress))
}

/// The span over which the test counted the client's transactions (Unix seconds).
#[derive(Clone, Copy)]
struct Window {
    from: f64,
    to: f64,
}

/// The server flow's sampler samples (end record) against the transactions the client
/// completed while the test counted them (from the start record's arrival to just before the
/// SIGTERM): one sample per transaction, less the one in flight at each end. The observer's
/// window is wider at both edges: it starts at the start record's `ts` (the record then reaches
/// the test) and ends at the end record's `ts` (after the SIGTERM). Those edges are measured in
/// the same run, and the transactions they hold (at the rate the test counted) are allowed on
/// top, plus 3: a fixed 12 (~100 ms at each edge) failed once at load 6 (2026-12-07).
fn assert_flow_timed(
    lines: &[Value],
    (transactions, w, start_ts): (u64, Window, f64),
    stderr: &str,
) {
    let end = lines.iter().find(|l| l["type"] == "end").unwrap();
    let end_ts = end["ts"].as_f64().unwrap();
    let rate = transactions as f64 / (w.to - w.from).max(1.0);
    let edges = (w.from - start_ts).max(0.0) + (end_ts - w.to).max(0.0);
    let extra = (rate * edges).ceil() as u64 + 3;
    let n: u64 = end["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["local"] == format!("{B_ADDR}:{PORT}"))
        .map(|f| f["sampler"]["summary"]["n"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        transactions >= 300
            && n as f64 >= 0.9 * transactions as f64 - 3.0
            && n <= transactions + extra,
        "{n} samples for {transactions} transactions (+{extra} allowed: {edges:.3} s of the observer's window outside the test's at {rate:.0}/s); stderr: {stderr}"
    );
    eprintln!("flow: {n} samples, {transactions} transactions (+{extra} allowed for {edges:.3} s of edges)");
}
