//! Issue 41: a pod's flow seen by the sampler on the pod's host-side veth (`lxc…`, in the node's
//! namespace, plain TCP, no tunnel) joins the row of the pod's socket (the TCP view's, in the
//! pod's namespace), with the side the socket knows; a flow seen on two interfaces gives its row
//! the samples of one of them (views/sampler/join.rs), each interface's count listed in the end
//! record (`iface_samples`); and the same ends in two namespaces join nothing (counted).
//!
//! - `a_pods_flow_on_its_lxc_joins_the_pod_socket_row`: two "nodes" (namespaces joined by a
//!   routed veth, `nic1` <-> `nic2`, no tunnel), a "pod" behind an `lxc` veth on each, a paced
//!   request/response flow pod to pod, ONE observer on both nodes' `lxc*` and underlays. Each
//!   socket's row has both views, its side, sampler samples within tolerance of the
//!   transactions (one interface's worth: the flow crosses two of them), `iface_samples` naming
//!   both interfaces (each within tolerance), and no sampler-only row of the flow is left in a
//!   node's namespace.
//! - `the_same_ends_in_two_namespaces_join_no_socket`: two single-node beds with the same
//!   addresses and a client bound to the same port in each: the sockets' ends are the same in
//!   two namespaces, so the flows seen on the nodes' `lxc`s join neither (`join_ambiguous`) and
//!   keep rows of their own in the nodes' namespaces; the pod rows have no sampler samples.
//!
//! Does not share node.rs's fixtures on purpose (a small bed of its own, no VXLAN). Needs root.
//! ~7 s each.
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rttscope_e2e::fixtures::{ip, lxc_pod};
use rttscope_e2e::{observe_json_attached, require_root, sh, NetNs, RrClient, RrServer};
use serde_json::Value;

const PORT: u16 = 7162;
const THINK: Duration = Duration::from_millis(10);

/// A pod: its namespace (deleted on drop, with its veth and the node's `lxc` end).
struct Pod {
    ns: NetNs,
    lxc: String,
    ip: String,
}

/// Nodes joined by a routed veth underlay (two nodes), pods behind `lxc` veths. Fields drop in
/// order: pods first, then the nodes.
struct Bed {
    pods: Vec<Pod>,
    nodes: Vec<NetNs>,
}

impl Bed {
    /// `n` nodes (1 or 2): node k's pods are in 10.46.<k+1>.0/24; two nodes route each other's
    /// pod subnet over `nic1`/`nic2` (192.168.81.0/24).
    fn new(n: usize) -> Bed {
        let nodes: Vec<NetNs> = (0..n).map(|_| NetNs::new("rtnj").unwrap()).collect();
        if n == 2 {
            let (a, b) = (&nodes[0].name, &nodes[1].name);
            sh(&[
                "ip", "link", "add", "nic1", "netns", a, "type", "veth", "peer", "name", "nic2",
                "netns", b,
            ])
            .unwrap();
            for (k, node) in nodes.iter().enumerate() {
                let (me, peer) = (k + 1, 2 - k);
                ip(node, &format!("addr add 192.168.81.{me}/24 dev nic{me}"));
                ip(node, &format!("link set nic{me} up"));
                ip(
                    node,
                    &format!("route add 10.46.{peer}.0/24 via 192.168.81.{peer}"),
                );
            }
        }
        for node in &nodes {
            node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])
                .unwrap();
        }
        Bed {
            pods: Vec::new(),
            nodes,
        }
    }

    /// Pod `i` on node `k` (address 10.46.<k+1>.<10+i>): its index.
    fn add_pod(&mut self, k: usize, i: u8) -> usize {
        let node = &self.nodes[k];
        let (lxc, addr) = (format!("lxc{k}p{i}"), format!("10.46.{}.{}", k + 1, 10 + i));
        let mac = format!("02:00:00:00:0{k}:{i:02x}");
        let ns = lxc_pod(node, "rtnjp", &lxc, &addr, &mac, 1500);
        self.pods.push(Pod { ns, lxc, ip: addr });
        self.pods.len() - 1
    }

    fn server(&self, p: usize) -> SocketAddr {
        format!("{}:{PORT}", self.pods[p].ip).parse().unwrap()
    }
}

/// An observer (tcp and sampler, every namespace) on `ifaces` for `secs`, returned attached.
fn observe(ifaces: &[String], secs: u32) -> std::thread::JoinHandle<anyhow::Result<Vec<Value>>> {
    let mut args: Vec<String> = ["--view", "tcp,sampler", "--all-netns", "--interval", "1s"]
        .map(String::from)
        .into();
    args.extend(["--duration".to_string(), format!("{secs}s")]);
    args.extend(
        ifaces
            .iter()
            .flat_map(|i| ["--iface".to_string(), i.clone()]),
    );
    observe_json_attached(args, Duration::from_secs(60 + secs as u64))
}

fn end(lines: &[Value]) -> &Value {
    let e = lines.iter().find(|l| l["type"] == "end");
    e.unwrap_or_else(|| panic!("no end record: {lines:?}"))
}

fn rows(lines: &[Value]) -> Vec<Value> {
    end(lines)["flows"].as_array().cloned().unwrap_or_default()
}

fn n_of(row: &Value, view: &str) -> u64 {
    row[view]["summary"]["n"].as_u64().unwrap_or(0)
}

/// The rows whose ends are (`local`, `remote`), in any namespace.
fn with_ends<'a>(rows: &'a [Value], local: &str, remote: &str) -> Vec<&'a Value> {
    let ends = |r: &&Value| r["local"] == local && r["remote"] == remote;
    rows.iter().filter(ends).collect()
}

/// The end record's rows of our addresses (histograms left out) and the sampler's counters:
/// printed on failure.
fn seen(lines: &[Value]) -> String {
    let mut out = String::new();
    for r in rows(lines) {
        if r["local"].as_str().unwrap_or("").starts_with("10.46.") {
            let mut r = r.clone();
            for v in ["tcp", "sampler"] {
                if let Some(o) = r[v].as_object_mut() {
                    o.remove("histogram");
                }
            }
            out.push_str(&format!("row {r}\n"));
        }
    }
    format!("{out}counters: {}", end(lines)["counters"]["sampler"])
}

/// Samples within the tolerance the node tests use for a flow wholly inside the observer's
/// window: one per transaction, at least 90% of them less 3, at most 3 more (the handshake, the
/// last response's delayed ACK).
fn timed(n: u64, tr: u64) -> bool {
    tr >= 50 && n as f64 >= 0.9 * tr as f64 - 3.0 && n <= tr + 3
}

/// A flow from pod `c` to the server on pod `s` made for ~3 s while the observer runs: the
/// client's address and the transactions it made.
fn paced_flow(bed: &Bed, c: usize, s: usize) -> (SocketAddr, u64) {
    let cli = RrClient::start(&bed.pods[c].ns, bed.server(s), 100, THINK).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    cli.pause();
    std::thread::sleep(Duration::from_millis(200));
    (cli.local, cli.transactions.load(Ordering::Relaxed) as u64)
}

#[test]
fn a_pods_flow_on_its_lxc_joins_the_pod_socket_row() {
    if !require_root() {
        return;
    }
    let mut bed = Bed::new(2);
    let (a, c) = (bed.add_pod(0, 1), bed.add_pod(1, 1));
    let _srv = RrServer::start(&bed.pods[c].ns, bed.server(c), 100).unwrap();
    let (n1, n2) = (bed.nodes[0].name.clone(), bed.nodes[1].name.clone());
    let ifaces = [
        format!("{n1}:lxc*"),
        format!("{n1}:nic1"),
        format!("{n2}:lxc*"),
        format!("{n2}:nic2"),
    ];
    let obs = observe(&ifaces, 5);
    let (client, tr) = paced_flow(&bed, a, c);
    let lines = obs.join().unwrap().unwrap();
    let (rows, seen) = (rows(&lines), seen(&lines));
    let (cl, sv) = (client.to_string(), bed.server(c).to_string());
    let (lxc_a, lxc_c) = (&bed.pods[a].lxc, &bed.pods[c].lxc);
    // each socket's row: the client's timed on nic1 (its requests leave node 1) and on the
    // server pod's lxc (they enter it); the server's on nic2 and on the client pod's lxc
    for (ns, local, remote, side, ifs) in [
        (
            &bed.pods[a].ns.name,
            &cl,
            &sv,
            "client",
            ["nic1", lxc_c.as_str()],
        ),
        (
            &bed.pods[c].ns.name,
            &sv,
            &cl,
            "server",
            ["nic2", lxc_a.as_str()],
        ),
    ] {
        let m = with_ends(&rows, local, remote);
        assert!(
            m.len() == 1 && m[0]["netns_name"] == **ns,
            "{side}: one row, in the pod's namespace {ns} (no sampler-only row in a node's): {seen}"
        );
        let r = m[0];
        let (ns_, nt) = (n_of(r, "sampler"), n_of(r, "tcp"));
        let per = &r["sampler"]["iface_samples"];
        eprintln!(
            "node_join: {side} row: side {}, sampler {ns_} from {} (per interface {per}), tcp {nt}, \
             {tr} transactions",
            r["side"], r["sampler"]["iface"]
        );
        assert_eq!(r["side"], side, "{seen}");
        assert!(
            timed(ns_, tr),
            "{side}: sampler {ns_} for {tr} transactions: {seen}"
        );
        assert!(
            timed(nt, tr),
            "{side}: tcp {nt} for {tr} transactions: {seen}"
        );
        let chosen = r["sampler"]["iface"].as_str().unwrap_or("");
        assert!(ifs.contains(&chosen), "{side}: iface {chosen}: {seen}");
        for i in ifs {
            let n = per[i].as_u64().unwrap_or(0);
            assert!(timed(n, tr), "{side}: {n} samples on {i}: {seen}");
        }
        assert_eq!(per[chosen].as_u64(), Some(ns_), "{seen}");
    }
    let c = &end(&lines)["counters"]["sampler"];
    let get = |k: &str| c[k].as_u64().unwrap_or(u64::MAX);
    // 4 sampler flows (nic1, nic2 and each pod's lxc), each joined across namespaces; the other
    // interface's samples of each row counted (intervals only: the last second's are not)
    assert!(
        get("join_across_netns") >= 4 && get("join_ambiguous") == 0,
        "{seen}"
    );
    assert!(
        get("samples_other_iface") as f64 >= 0.9 * tr as f64 - 3.0,
        "{seen}"
    );
}

#[test]
fn the_same_ends_in_two_namespaces_join_no_socket() {
    if !require_root() {
        return;
    }
    let mut beds = [Bed::new(1), Bed::new(1)];
    let mut ifaces = Vec::new();
    let mut srv = Vec::new();
    for bed in &mut beds {
        let (a, b) = (bed.add_pod(0, 1), bed.add_pod(0, 2));
        srv.push(RrServer::start(&bed.pods[b].ns, bed.server(b), 100).unwrap());
        ifaces.push(format!("{}:lxc*", bed.nodes[0].name));
        assert_eq!((a, b), (0, 1));
    }
    let obs = observe(&ifaces, 4);
    let (cl, sv) = ("10.46.1.11:40162", "10.46.1.12:7162");
    let clients: Vec<RrClient> = beds
        .iter()
        .map(|bed| {
            let (local, server) = (cl.parse().unwrap(), sv.parse().unwrap());
            RrClient::start_bound(&bed.pods[0].ns, local, server, 100, THINK).unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let lines = obs.join().unwrap().unwrap();
    let tr: Vec<u64> = clients
        .iter()
        .map(|c| c.transactions.load(Ordering::Relaxed) as u64)
        .collect();
    drop(clients);
    let (rows, seen) = (rows(&lines), seen(&lines));
    eprintln!("node_join: same ends, {tr:?} transactions: {seen}");
    for bed in &beds {
        let node = &bed.nodes[0].name;
        for (pod, local, remote) in [(0, cl, sv), (1, sv, cl)] {
            let in_ns = |ns: &str| {
                let m = with_ends(&rows, local, remote);
                m.into_iter().find(|r| r["netns_name"] == ns).cloned()
            };
            let p = in_ns(&bed.pods[pod].ns.name).unwrap_or_else(|| panic!("no pod row: {seen}"));
            assert!(
                n_of(&p, "tcp") >= 50 && n_of(&p, "sampler") == 0,
                "{p}: {seen}"
            );
            // the node's own row of the flow: kept apart, with the lxc's samples
            let r = in_ns(node).unwrap_or_else(|| panic!("no row in node {node}: {seen}"));
            assert!(
                n_of(&r, "sampler") >= 50 && n_of(&r, "tcp") == 0,
                "{r}: {seen}"
            );
        }
    }
    let c = &end(&lines)["counters"]["sampler"];
    // 2 flows on each node (requests on the server pod's lxc, responses on the client's)
    let (amb, across) = (
        c["join_ambiguous"].as_u64(),
        c["join_across_netns"].as_u64(),
    );
    assert!(amb >= Some(4) && across == Some(0), "{seen}");
}
