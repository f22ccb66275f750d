//! Issue 41 item 6: a Kubernetes node in the suite. Two "nodes" (namespaces joined by a veth
//! underlay, `nic1` <-> `nic2`) with a real kernel VXLAN between them (`vx0`, VNI 42, UDP 4789),
//! and "pods" (namespaces behind veths whose host-side ends are in the node's namespace, named
//! `lxc…` as Cilium names them; each pod has a /32 with a default route to 169.254.1.1 on the
//! `lxc`'s fixed MAC, the node routes each pod's /32 to its `lxc` and the other node's pod
//! subnet across the VXLAN, ip_forward on). Real request/response flows pod to pod across the
//! nodes, with the busy-host load beside them (tests/src/busy.rs, plus a second connection and
//! pings from a client pod), observed by ONE observer: `observe --view tcp,sampler --all-netns
//! --iface 'N1:lxc*' --iface N1:nic1 --iface 'N2:lxc*' --iface N2:nic2`.
//!
//! - `pods_across_a_vxlan_are_one_row_each_and_come_and_go`: every pod-to-pod flow is one row
//!   per socket (client pod and server pod) with both views, samples within tolerance of the
//!   transactions the clients counted; rows carry `tunnel` (VNI 42, vxlan); a CNI stand-in
//!   (tests/fixtures/cni_standin.bpf.c, ends the chain) at clsact priority 1 on one pod's `lxc`
//!   and as tcx links first on another's: under tcx (this kernel's default) the sampler goes
//!   first on both and times both flows; a pod created after the start is attached within a
//!   second and its flow timed, a pod deleted is released, nothing left attached at the end;
//! - `a_clsact_observer_behind_a_cni_at_priority_1_says_so`: `--attach clsact`: the hooks behind
//!   the priority-1 stand-in are reported blind (stderr, `hooks[].blind`), the flow is not
//!   silently missing (its row is there with the TCP view), and no sample is made up.
//!
//! Needs root, clang-19, tc and the vxlan module. ~15 s.
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rttscope::sys::bpfprog::{self, asm, ProgSpec};
use rttscope_e2e::busy::{BusyHost, Responder};
use rttscope_e2e::fixtures::{cni_standin_object, ip, lxc_pod, KernelVxlan, VxlanSpec};
use rttscope_e2e::observer::{unix_now, Observer};
use rttscope_e2e::{require_root, rttscope_bin, NetNs, Pair, RrClient, RrServer};
use serde_json::Value;

const PORT: u16 = 7161;
const THINK: Duration = Duration::from_millis(10);
const VNI: u64 = 42;

fn sysctl(ns: &NetNs, kv: &str) {
    ns.exec(&["sysctl", "-qw", kv]).unwrap();
}

/// A pod: its namespace (deleted on drop, taking its veth and the node's `lxc` end with it).
struct Pod {
    ns: NetNs,
    lxc: String,
    ip: String,
}

/// The testbed. Fields drop in order: pods first, then the nodes (NetNs deletes on drop).
struct Node2 {
    pods: Vec<Pod>,
    nodes: [NetNs; 2],
}

impl Node2 {
    fn new() -> Node2 {
        let vx = KernelVxlan::new(VxlanSpec {
            ns_prefix: "rtkn",
            under: ["nic1".into(), "nic2".into()],
            underlay: "192.168.79",
            inner: "10.45.255",
            port: 4789,
            vni: VNI as u32,
        });
        for (k, n) in vx.ns.iter().enumerate() {
            let peer = 2 - k;
            ip(
                n,
                &format!("route add 10.45.{peer}.0/24 via 10.45.255.{peer} dev vx0"),
            );
            sysctl(n, "net.ipv4.ip_forward=1");
        }
        Node2 {
            pods: Vec::new(),
            nodes: vx.ns,
        }
    }

    /// A pod on node `k` (0 or 1), number `i` (its address 10.45.<k+1>.<10+i>); returns its index.
    fn add_pod(&mut self, k: usize, i: u8) -> usize {
        let node = &self.nodes[k];
        let (lxc, addr) = (format!("lxc{k}p{i}"), format!("10.45.{}.{}", k + 1, 10 + i));
        let mac = format!("02:00:00:00:0{k}:{i:02x}");
        let ns = lxc_pod(node, "rtkp", &lxc, &addr, &mac, 1400);
        self.pods.push(Pod { ns, lxc, ip: addr });
        self.pods.len() - 1
    }

    fn server(&self, p: usize) -> SocketAddr {
        format!("{}:{PORT}", self.pods[p].ip).parse().unwrap()
    }

    /// The observer's interface arguments: both nodes' `lxc*` and underlays.
    fn ifaces(&self) -> Vec<String> {
        let (a, b) = (&self.nodes[0].name, &self.nodes[1].name);
        [
            format!("{a}:lxc*"),
            format!("{a}:nic1"),
            format!("{b}:lxc*"),
            format!("{b}:nic2"),
        ]
        .into_iter()
        .flat_map(|i| ["--iface".to_string(), i])
        .collect()
    }
}

/// The stand-in as a clsact filter at priority 1 on both hooks of `ifname` (in `ns`).
fn clsact_standin(ns: &NetNs, ifname: &str) {
    let obj = cni_standin_object();
    ns.exec(&["tc", "qdisc", "add", "dev", ifname, "clsact"])
        .unwrap();
    for hook in ["ingress", "egress"] {
        ns.exec(&[
            "tc",
            "filter",
            "add",
            "dev",
            ifname,
            hook,
            "prio",
            "1",
            "handle",
            "1",
            "bpf",
            "da",
            "obj",
            obj.to_str(),
            "sec",
            "tc",
        ])
        .unwrap();
    }
}

/// A program that returns 0 (TCX_PASS: ends the chain) as tcx links first on both hooks of
/// `ifname`; detached when the links drop.
fn tcx_standin(ns: &NetNs, ifname: &str) -> Vec<OwnedFd> {
    let name = ifname.to_string();
    ns.run(move || {
        let spec = ProgSpec {
            prog_type: bpfprog::PROG_SCHED_CLS,
            name: "cni_standin",
            ..ProgSpec::default()
        };
        let prog = bpfprog::prog_load(spec, &[asm::mov_imm(0, 0), asm::exit()]).unwrap();
        let ifindex = nix::net::if_::if_nametoindex(name.as_str()).unwrap();
        [bpfprog::ATTACH_TCX_INGRESS, bpfprog::ATTACH_TCX_EGRESS]
            .into_iter()
            .map(|at| bpfprog::link_create_flags(&prog, ifindex, at, bpfprog::LINK_BEFORE).unwrap())
            .collect()
    })
}

/// The tcx programs on a hook of `ifname` in `ns` (the kernel's list, in order): empty if gone.
fn tcx_progs(ns: &NetNs, ifname: &str, egress: bool) -> Vec<u32> {
    let name = ifname.to_string();
    ns.run(move || {
        let Ok(ifindex) = nix::net::if_::if_nametoindex(name.as_str()) else {
            return Vec::new();
        };
        let at = [bpfprog::ATTACH_TCX_INGRESS, bpfprog::ATTACH_TCX_EGRESS][egress as usize];
        rttscope::sys::bpf::prog_query(ifindex, at).unwrap_or_default()
    })
}

/// The clsact filters on `ifname` in `ns` (`tc filter show`, both hooks).
fn clsact_filters(ns: &NetNs, ifname: &str) -> String {
    let mut out = String::new();
    for hook in ["ingress", "egress"] {
        let o = Command::new("ip")
            .args([
                "netns", "exec", &ns.name, "tc", "filter", "show", "dev", ifname, hook,
            ])
            .output()
            .unwrap();
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}

/// `rttscope observe --format json --interval 1s --view tcp,sampler --all-netns ARGS`, its
/// start line read.
fn observe(args: &[String]) -> Observer {
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--format", "json", "--interval", "1s"])
        .args(["--view", "tcp,sampler", "--all-netns"])
        .args(args);
    Observer::spawn(&mut cmd, "observer")
}

/// A measured flow: client pod -> server pod, the transactions counted while observed.
struct Flow {
    what: &'static str,
    client_ns: String,
    server_ns: String,
    local: SocketAddr,
    server: SocketAddr,
    transactions: u64,
}

fn end_rows(lines: &[Value]) -> Vec<Value> {
    let end = lines.iter().find(|l| l["type"] == "end");
    let end = end.unwrap_or_else(|| panic!("no end record: {lines:?}"));
    end["flows"].as_array().cloned().unwrap_or_default()
}

fn n_of(row: &Value, view: &str) -> u64 {
    row[view]["summary"]["n"].as_u64().unwrap_or(0)
}

/// Samples within the usual tolerance of the transactions (as churn.rs and sampler_chain.rs):
/// one sample per transaction, at least 90% of them less 3 (the one in flight at each edge, any
/// the attach missed), at most `extra` more (the observer's window is wider than the test's
/// count at both edges: measured, at the counted rate, + 3).
fn assert_timed(what: &str, n: u64, tr: u64, extra: u64, row: &Value) {
    assert!(
        tr >= 50 && n as f64 >= 0.9 * tr as f64 - 3.0 && n <= tr + extra,
        "{what}: {n} samples for {tr} transactions (+{extra} allowed): {row}"
    );
}

/// Wait until both tcx hooks of `ifname` in `ns` run one of `ours`: the time it took.
fn until_attached(ns: &NetNs, ifname: &str, ours: &[u32]) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let on = |e| tcx_progs(ns, ifname, e).iter().any(|id| ours.contains(id));
        if on(false) && on(true) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// A flow from pod `c` to the server on pod `s` (its client started); counted by `finish`.
struct Running(Flow, RrClient, u32);

fn run_flow(bed: &Node2, what: &'static str, c: usize, s: usize) -> Running {
    let server = bed.server(s);
    let cli = RrClient::start(&bed.pods[c].ns, server, 100, THINK).unwrap();
    let t0 = cli.transactions.load(Ordering::Relaxed);
    let f = Flow {
        what,
        client_ns: bed.pods[c].ns.name.clone(),
        server_ns: bed.pods[s].ns.name.clone(),
        local: cli.local,
        server,
        transactions: 0,
    };
    Running(f, cli, t0)
}

fn finish(r: Running) -> Flow {
    let Running(mut f, cli, t0) = r;
    f.transactions = (cli.transactions.load(Ordering::Relaxed) - t0) as u64;
    f
}

/// Nothing of ours left: no program loaded, no clsact filter but the stand-in's, no tcx link.
fn assert_nothing_left(bed: &Node2, ours: &[u32]) {
    // the kernel frees a program after its last filter's RCU grace period, asynchronously: once
    // the observer has exited, within 5 s (sampler.rs allows the same after a kill)
    let t0 = Instant::now();
    loop {
        let alive: Vec<&u32> = ours
            .iter()
            .filter(|id| rttscope::sys::bpf::prog_name_by_id(**id).is_ok())
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "programs {alive:?} still loaded 5 s after the observer's exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if t0.elapsed() > Duration::from_millis(50) {
        eprintln!(
            "node: our programs unloaded {:?} after the exit",
            t0.elapsed()
        );
    }
    for (k, n) in bed.nodes.iter().enumerate() {
        let mut ifs: Vec<String> = bed.pods.iter().map(|p| p.lxc.clone()).collect();
        ifs.push(format!("nic{}", k + 1));
        for i in ifs {
            for e in [false, true] {
                let left = tcx_progs(n, &i, e);
                assert!(left.iter().all(|id| !ours.contains(id)), "{i}: {left:?}");
            }
            let f = clsact_filters(n, &i);
            assert!(
                !f.contains("rttscope") && !f.contains("sampler"),
                "{i}: {f}"
            );
        }
    }
}

/// The busy-host load (other namespaces, busy.rs) plus a second connection and pings from the
/// first client pod to the first server: none of it may be counted in the test's rows.
fn busy(bed: &Node2, c: usize, s: usize) -> (Pair, RrServer, BusyHost, RrClient) {
    let pair = Pair::new().unwrap();
    let addr: SocketAddr = format!("{}:{PORT}", rttscope_e2e::B_ADDR).parse().unwrap();
    let srv = RrServer::start(&pair.b, addr, 100).unwrap();
    let mut b = BusyHost::start(&pair, addr, Responder::Plain { resp: 100 }).unwrap();
    let server = bed.server(s);
    b.also_ping(&bed.pods[c].ns, server.ip()).unwrap();
    let other = RrClient::start(&bed.pods[c].ns, server, 100, THINK).unwrap();
    (pair, srv, b, other)
}

/// The testbed both tests start from, its parts owned by the test (which drops them when it
/// means to).
struct FourPods {
    bed: Node2,
    /// Pods a and b on node 0, c and d on node 1.
    pods: [usize; 4],
    /// The servers in c and d.
    servers: [RrServer; 2],
    /// The tcx stand-in's links on b's lxc.
    tcx: Vec<OwnedFd>,
    /// The busy-host load a->c.
    load: (Pair, RrServer, BusyHost, RrClient),
    /// The flows a->c and b->d, running.
    flows: [Running; 2],
}

/// Two nodes of two pods each; the CNI stand-in as a clsact filter at priority 1 on a's lxc and
/// as tcx links first on b's; the busy-host load; flows a->c and b->d running.
fn four_pods_behind_standins() -> FourPods {
    let mut bed = Node2::new();
    let (a, b) = (bed.add_pod(0, 1), bed.add_pod(0, 2));
    let (c, d) = (bed.add_pod(1, 1), bed.add_pod(1, 2));
    let servers = [c, d].map(|s| RrServer::start(&bed.pods[s].ns, bed.server(s), 100).unwrap());
    clsact_standin(&bed.nodes[0], &bed.pods[a].lxc);
    let tcx = tcx_standin(&bed.nodes[0], &bed.pods[b].lxc);
    let load = busy(&bed, a, c);
    let flows = [run_flow(&bed, "a->c", a, c), run_flow(&bed, "b->d", b, d)];
    FourPods {
        bed,
        pods: [a, b, c, d],
        servers,
        tcx,
        load,
        flows,
    }
}

#[test]
fn pods_across_a_vxlan_are_one_row_each_and_come_and_go() {
    if !require_root() {
        return;
    }
    let FourPods {
        mut bed,
        pods: [a, b, _, d],
        servers: _srv,
        tcx: _tcx,
        load,
        flows: [fa, fb],
    } = four_pods_behind_standins();
    let obs = observe(&bed.ifaces());
    let (ours, t_seen, start_ts) = (
        obs.sampler_prog_ids(),
        unix_now(),
        obs.start["ts"].as_f64().unwrap(),
    );
    let (mut fa, mut fb) = (fa, fb);
    for r in [&mut fa, &mut fb] {
        r.2 = r.1.transactions.load(Ordering::Relaxed); // counted from the start record
    }
    std::thread::sleep(Duration::from_millis(1000));
    let e = bed.add_pod(0, 3); // a pod after the start: attached within a second, its flow timed
    let late = until_attached(&bed.nodes[0], &bed.pods[e].lxc, &ours);
    let fe = run_flow(&bed, "e->d (late pod)", e, d);
    std::thread::sleep(Duration::from_millis(3000));
    let fe = finish(fe);
    drop(bed.pods.remove(e)); // the pod deleted mid-run: released
    std::thread::sleep(Duration::from_millis(1200));
    let flows = [finish(fa), finish(fb), fe];
    let t_stop = unix_now();
    let (lines, stderr) = obs.stop();
    drop(load);
    let extra = edges_allowance(&flows[0], &lines, (t_seen, start_ts, t_stop));
    let rows = end_rows(&lines);
    let seen = Seen(&rows, &stderr);
    eprintln!("node: late pod attached after {late:?}");
    for f in &flows {
        let x = if f.what.contains("late") { 3 } else { extra };
        assert_pod_rows(f, &rows, x, &seen);
    }
    // the stand-ins (clsact priority 1 on a's lxc, tcx first on b's): under tcx the sampler goes
    // first on both; their hooks see every packet and time the flow crossing them
    let hooks = &lines.iter().find(|l| l["type"] == "end").unwrap()["hooks"];
    for (p, f, how) in [(a, &flows[0], "clsact 1"), (b, &flows[1], "tcx first")] {
        assert_lxc_timed(&bed.pods[p].lxc, f, (&rows, hooks), extra, &seen);
        eprintln!(
            "node: stand-in ({how}) on {}: not blind, flow timed",
            bed.pods[p].lxc
        );
    }
    assert!(!stderr.contains("blind"), "{seen:?}");
    let late = late.unwrap_or_else(|| panic!("the late pod's lxc not attached within 3 s"));
    assert!(late <= Duration::from_secs(1), "attached after {late:?}");
    assert_iface_counters(&lines);
    assert_nothing_left(&bed, &ours);
}

/// The pattern's interfaces, counted: 2 lxc + the underlay on each node at start and the late
/// pod's lxc attached, that one released when its pod was deleted; the tunnel parsed, nothing
/// skipped.
fn assert_iface_counters(lines: &[Value]) {
    let c = &lines.iter().find(|l| l["type"] == "end").unwrap()["counters"]["sampler"];
    // 2 lxc + nic on each node at start, the late pod's lxc; it is released when deleted
    assert_eq!(
        (c["ifaces_attached"].as_u64(), c["ifaces_released"].as_u64()),
        (Some(7), Some(1)),
        "{c}"
    );
    assert_eq!(c["ifaces_live"].as_u64(), Some(6), "{c}");
    assert!(c["tunnel_vxlan"].as_u64().unwrap_or(0) > 0, "{c}");
    for k in [
        "skip_non_tcp",
        "skip_truncated",
        "skip_nonlinear",
        "tcp_bad_checksum",
    ] {
        assert_eq!(c[k].as_u64(), Some(0), "{k}: {c}");
    }
}

/// The test's view of the end record and stderr, printed on failure.
struct Seen<'a>(&'a [Value], &'a str);

impl std::fmt::Debug for Seen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in self
            .0
            .iter()
            .filter(|r| r["local"].as_str().unwrap_or("").starts_with("10.45."))
        {
            let mut r = r.clone();
            for v in ["tcp", "sampler"] {
                if let Some(o) = r[v].as_object_mut() {
                    o.remove("histogram");
                }
            }
            writeln!(f, "row {r}")?;
        }
        write!(f, "stderr: {}", self.1)
    }
}

/// Transactions the observer's window holds beyond the test's count (churn.rs): from the start
/// record's `ts` to its arrival, and from the test's last count to the end record's `ts`, at
/// the rate the test counted, + 3.
fn edges_allowance(f: &Flow, lines: &[Value], (seen, start_ts, stop): (f64, f64, f64)) -> u64 {
    let end_ts = lines.iter().find(|l| l["type"] == "end").unwrap()["ts"]
        .as_f64()
        .unwrap();
    let rate = f.transactions as f64 / (stop - seen).max(1.0);
    let edges = (seen - start_ts).max(0.0) + (end_ts - stop).max(0.0);
    (rate * edges).ceil() as u64 + 3
}

/// Each of `f`'s sockets is one row in its pod's namespace, with both views, keyed by the inner
/// tuple + VNI (seen on the underlay), samples within tolerance of the transactions.
fn assert_pod_rows(f: &Flow, rows: &[Value], extra: u64, seen: &Seen) {
    let (l, s) = (f.local.to_string(), f.server.to_string());
    for (ns, local, remote, side) in [
        (&f.client_ns, &l, &s, "client"),
        (&f.server_ns, &s, &l, "server"),
    ] {
        let m: Vec<&Value> = rows
            .iter()
            .filter(|r| r["local"] == *local && r["remote"] == *remote && r["netns_name"] == **ns)
            .collect();
        assert_eq!(m.len(), 1, "{}: one {side} row in {ns}: {seen:?}", f.what);
        let r = m[0];
        assert_eq!(r["side"], side, "{}: {r}", f.what);
        assert_eq!(
            (r["tunnel"]["vni"].as_u64(), r["tunnel"]["encap"].as_str()),
            (Some(VNI), Some("vxlan")),
            "{r}"
        );
        let (ns_, nt) = (n_of(r, "sampler"), n_of(r, "tcp"));
        eprintln!(
            "node: {} {side}: sampler {ns_} ({}), tcp {nt}, {} transactions (+{extra})",
            f.what, r["sampler"]["iface"], f.transactions
        );
        assert_timed(
            &format!("{} {side} sampler", f.what),
            ns_,
            f.transactions,
            extra,
            r,
        );
        assert_timed(
            &format!("{} {side} tcp", f.what),
            nt,
            f.transactions,
            extra,
            r,
        );
    }
}

/// `lxc`'s hooks are not blind and saw every packet the interface moved; the flow crossing it
/// is timed there (the server's responses going to the pod: a row in the node's namespace).
fn assert_lxc_timed(
    lxc: &str,
    f: &Flow,
    (rows, hooks): (&[Value], &Value),
    extra: u64,
    seen: &Seen,
) {
    let hs: Vec<&Value> = hooks
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["iface"].as_str().unwrap_or("").ends_with(lxc))
        .collect();
    assert_eq!(hs.len(), 2, "{lxc}: {hooks}");
    for h in hs {
        let (hp, ip) = (
            h["hook_packets"].as_u64().unwrap(),
            h["iface_packets"].as_u64().unwrap(),
        );
        assert!(h["blind"] == false && hp >= ip && ip > 100, "{lxc}: {h}");
    }
    // the server's responses crossing the client pod's lxc join the server socket's row
    // (views/sampler/join.rs), which lists each interface's samples
    let r = rows
        .iter()
        .find(|r| {
            r["sampler"]["iface_samples"][lxc].is_u64()
                && r["local"] == f.server.to_string()
                && r["remote"] == f.local.to_string()
        })
        .unwrap_or_else(|| panic!("{lxc}: no row of {}: {seen:?}", f.what));
    let n = r["sampler"]["iface_samples"][lxc].as_u64().unwrap();
    eprintln!(
        "node: {} on {lxc} (row in {}, side {}): sampler {n}",
        f.what, r["netns_name"], r["side"]
    );
    assert_timed(&format!("{} on {lxc}", f.what), n, f.transactions, extra, r);
}

#[test]
fn a_clsact_observer_behind_a_cni_at_priority_1_says_so() {
    if !require_root() {
        return;
    }
    let FourPods {
        bed,
        pods: [a, b, _, _],
        servers: _srv,
        tcx,
        load: _load,
        flows: [mut fa, mut fb],
    } = four_pods_behind_standins();
    let mut args = bed.ifaces();
    args.extend(["--attach".to_string(), "clsact".to_string()]);
    let obs = observe(&args);
    let (ours, t_seen, start_ts) = (
        obs.sampler_prog_ids(),
        unix_now(),
        obs.start["ts"].as_f64().unwrap(),
    );
    for r in [&mut fa, &mut fb] {
        r.2 = r.1.transactions.load(Ordering::Relaxed);
    }
    let att = obs.start["sampler"]["attached"].as_array().unwrap();
    assert!(
        att.len() == 6 && att.iter().all(|x| x["how"] == "clsact"),
        "{}",
        obs.start
    );
    std::thread::sleep(Duration::from_millis(3500));
    let flows = [finish(fa), finish(fb)];
    let t_stop = unix_now();
    let (lines, stderr) = obs.stop();
    let extra = edges_allowance(&flows[0], &lines, (t_seen, start_ts, t_stop));
    let rows = end_rows(&lines);
    let seen = Seen(&rows, &stderr);
    let hooks = &lines.iter().find(|l| l["type"] == "end").unwrap()["hooks"];
    // behind the stand-in at priority 1 (a's lxc) and behind the tcx stand-in (b's lxc: tcx runs
    // before every clsact filter): each hook blind, said on stderr, no sample made up there
    for (p, ahead) in [(a, "priority 1"), (b, "tcx program cni_standin")] {
        let lxc = &bed.pods[p].lxc;
        for d in ["ingress", "egress"] {
            let h = hooks.as_array().unwrap().iter().find(|h| {
                h["iface"].as_str().unwrap_or("").ends_with(lxc.as_str()) && h["direction"] == d
            });
            let h = h.unwrap_or_else(|| panic!("no {d} hook for {lxc}: {hooks}"));
            assert!(
                h["blind"] == true && h["hook_packets"] == 0,
                "{lxc} {d}: {h}"
            );
            assert!(h["iface_packets"].as_u64().unwrap() > 100, "{lxc} {d}: {h}");
            let said = stderr
                .lines()
                .any(|l| l.contains("blind on ") && l.contains(&format!("{lxc} {d}")));
            assert!(said, "{lxc} {d}: no blind notice: {seen:?}");
        }
        assert!(stderr.contains(ahead), "{lxc}: {ahead} named: {seen:?}");
        let on_lxc = rows
            .iter()
            .filter(|r| r["sampler"]["iface"] == lxc.as_str());
        assert_eq!(
            on_lxc.map(|r| n_of(r, "sampler")).sum::<u64>(),
            0,
            "{lxc}: {seen:?}"
        );
    }
    // not silently missing: both flows are still one row per socket, timed on the underlays
    for f in &flows {
        assert_pod_rows(f, &rows, extra, &seen);
    }
    eprintln!("node (clsact): stderr {stderr}");
    drop(tcx);
    assert_nothing_left(&bed, &ours);
}
