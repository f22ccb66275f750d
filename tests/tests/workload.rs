//! Flows named by their owners (`--label-workload`, docs/deploy.md#labels):
//! real cgroups laid out as the kubelet with containerd (systemd driver),
//! CRI-O and systemd lay them out, made by the test under the cgroup v2 root
//! (below one directory of its own), real servers and clients (rttscope
//! serve / probe tcp-rr processes) moved into them before they open a socket,
//! real namespaces: the "pod" namespace's only processes live in the pod's
//! container cgroup, the "CRI-O" namespace's in the CRI-O scope. One observer
//! run is checked in all three outputs: /metrics, `--format json`, the result
//! document. Truth: the cgroup each process was put in, the pod directory the
//! test wrote (namespace/name), the namespaces it made.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use prometheus_parse::Scrape;
use rttscope_e2e::*;
use serde_json::Value;

const METRICS_PORT: u16 = 9465;
/// The second observer's (the sampler alone).
const METRICS_PORT_S: u16 = 9466;
const CTR_POD: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
const CTR_CRIO: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// The cgroup v2 mount (hybrid hosts: /sys/fs/cgroup/unified).
fn cgroup2_root() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next() == Some("cgroup2"))
                .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))
                .flatten()
        })
        .expect("a cgroup v2 mount")
}

/// A directory tree of cgroups under the v2 root, removed (deepest first) on drop.
struct Cgroups {
    top: PathBuf,
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    fn new() -> Cgroups {
        let top = cgroup2_root().join(unique("rtscg"));
        std::fs::create_dir(&top).unwrap();
        Cgroups {
            top,
            dirs: Vec::new(),
        }
    }
    /// Make `rel` (and its parents) below the test's directory.
    fn make(&mut self, rel: &str) -> PathBuf {
        let mut p = self.top.clone();
        for c in rel.split('/') {
            p = p.join(c);
            if !p.exists() {
                std::fs::create_dir(&p).unwrap();
                self.dirs.push(p.clone());
            }
        }
        p
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev().chain(std::iter::once(&self.top)) {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100)); // its processes are still exiting
            }
        }
    }
}

/// `rttscope ARGS` started inside cgroup `cg` and network namespace `ns`
/// (None: the host's): the shell moves itself into the cgroup, then becomes
/// nsenter, then rttscope.
fn spawn_in(cg: &Path, ns: Option<&NetNs>, args: &[&str]) -> ChildGuard {
    let enter = ns.map_or(String::new(), |n| {
        format!("nsenter --net=/var/run/netns/{} ", n.name)
    });
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {enter}{} {}",
        cg.display(),
        rttscope_bin().display(),
        args.join(" ")
    );
    ChildGuard::spawn(Command::new("sh").args(["-c", &script])).unwrap()
}

fn scrape_in(ns: &NetNs, port: u16) -> std::io::Result<String> {
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
}

/// `rttscope observe --label-workload` in namespace `a` for 7 s: `views`,
/// the sampler on `ifaces`, JSON lines on stdout, the result document at `result`.
fn observer(
    a: &NetNs,
    logs: &Path,
    port: u16,
    views: &str,
    ifaces: &[String],
    result: &Path,
) -> ChildGuard {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{}", a.name))
        .env("RTTSCOPE_POD_LOG_DIR", logs)
        .arg(rttscope_bin())
        .args(["observe", "--label-workload", "--format", "json"])
        .args(["--interval", "500ms", "--duration", "7s", "--view", views])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--label-port", "7101", "--label-port", "7102"])
        .args(["--label-port", "7103", "--label-port", "7104", "-o"])
        .arg(result);
    for i in ifaces {
        cmd.args(["--iface", i]);
    }
    ChildGuard::spawn(&mut cmd).unwrap()
}

/// The label sets (as maps) of RTT series of `view` with samples.
fn series(body: &str, view: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    let s = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    s.samples
        .iter()
        .filter(|x| x.metric == "rttscope_rtt_seconds" && x.labels.get("view") == Some(view))
        .map(|x| {
            let mut m: std::collections::BTreeMap<String, String> = x
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            m.remove("le");
            m
        })
        .collect()
}

/// A veth pair between `a` (10.78.0.1/24) and `c` (10.78.0.2/24); `c`'s end's name.
fn link(a: &NetNs, c: &NetNs) -> String {
    let (ia, ic) = (unique("vc"), unique("vd"));
    sh(&[
        "ip", "link", "add", &ia, "netns", &a.name, "type", "veth", "peer", "name", &ic, "netns",
        &c.name,
    ])
    .unwrap();
    a.exec(&["ip", "addr", "add", "10.78.0.1/24", "dev", &ia])
        .unwrap();
    c.exec(&["ip", "addr", "add", "10.78.0.2/24", "dev", &ic])
        .unwrap();
    a.exec(&["ip", "link", "set", &ia, "up"]).unwrap();
    c.exec(&["ip", "link", "set", &ic, "up"]).unwrap();
    ic
}

#[test]
fn flows_carry_pod_container_and_unit_labels() {
    if !require_root() {
        return;
    }
    let uid = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
    let uid_ = uid.replace('-', "_");
    let mut cg = Cgroups::new();
    let pod_cg = cg.make(&format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{CTR_POD}.scope"
    ));
    let crio_cg = cg.make(&format!("machine.slice/crio-{CTR_CRIO}.scope"));
    let svc_cg = cg.make("system.slice/rts-web.service");
    let cli_cg = cg.make("user.slice/rts-client.scope");
    // The kubelet's pod log directory names the pod.
    let logs = std::env::temp_dir().join(unique("rtspods"));
    std::fs::create_dir_all(logs.join(format!("shop_checkout-0_{uid}"))).unwrap();

    // a: clients and the systemd service; b: the pod's namespace; c: the CRI-O container's.
    let p = Pair::new().unwrap();
    let c = NetNs::new("rtsc").unwrap();
    let c_if = link(&p.a, &c);
    let _pod_srv = spawn_in(
        &pod_cg,
        Some(&p.b),
        &["serve", "--listen", &format!("{B_ADDR}:7101")],
    );
    let _crio_srv = spawn_in(&crio_cg, Some(&c), &["serve", "--listen", "10.78.0.2:7102"]);
    // The host's loopback: sockets only, nothing added to the host's network.
    let _host_srv = spawn_in(&svc_cg, None, &["serve", "--listen", "127.0.0.1:7104"]);
    let _svc_srv = spawn_in(
        &svc_cg,
        Some(&p.a),
        &["serve", "--listen", &format!("{A_ADDR}:7103")],
    );

    let seen = observe_probes_from_the_clients_scope(&p, (&c, &c_if), &logs, &cli_cg);
    let _ = std::fs::remove_dir_all(&logs);
    let pod_ns = "pod:shop/checkout-0".to_string();
    let crio_ns = format!("container:{}", &CTR_CRIO[..12]);
    let owners = assert_server_series_carry_their_owners(&seen, &p.a.name, (&pod_ns, &crio_ns));
    assert_client_series_carry_the_clients_scope(&seen, &p.a.name);
    assert_sampler_series_carry_the_same_labels(&seen, &owners, &p.a.name);
    assert_rows_and_documents_name_the_owners(&seen, uid, &pod_ns);
    // The sampler alone looked its flows' sockets up (counted).
    let last = seen
        .lines_s
        .iter()
        .rev()
        .find(|l| l["type"] == "interval")
        .unwrap();
    assert!(
        last["counters"]["sampler"]["owner_lookups"].as_u64() > Some(0),
        "{}",
        last["counters"]
    );
}

/// A series' labels.
type Labels = std::collections::BTreeMap<String, String>;

/// What the two observers of the test's traffic gave (both views, and the sampler alone):
/// their /metrics, JSON lines, result documents and stderr.
struct Seen {
    body: String,
    body_s: String,
    lines: Vec<Value>,
    lines_s: Vec<Value>,
    doc: Value,
    doc_s: Value,
    err: String,
    err_s: String,
}

/// Two observers of the same traffic: both views (the sampler's owners then come from the TCP
/// view where it has the flow), and the sampler alone (owners from each flow's local socket
/// through sock_diag only); four `probe tcp-rr` from the clients' cgroup, to each server.
fn observe_probes_from_the_clients_scope(
    p: &Pair,
    (c, c_if): (&NetNs, &str),
    logs: &Path,
    cli_cg: &Path,
) -> Seen {
    let result = std::env::temp_dir().join(format!("{}.json", unique("rtswl")));
    let result_s = std::env::temp_dir().join(format!("{}.json", unique("rtswl")));
    let ifaces = [
        format!("{}:{}", p.b.name, p.b_if),
        format!("{}:{c_if}", c.name),
        format!("{}:lo", p.a.name),
    ];
    let obs = observer(&p.a, logs, METRICS_PORT, "tcp,sampler", &ifaces, &result);
    let obs_s = observer(&p.a, logs, METRICS_PORT_S, "sampler", &ifaces, &result_s);
    let t0 = Instant::now();
    while scrape_in(&p.a, METRICS_PORT).is_err() || scrape_in(&p.a, METRICS_PORT_S).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "observer did not serve /metrics"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let rr = |host: &str, port: &str| -> ChildGuard {
        spawn_in(
            cli_cg,
            (host != "127.0.0.1").then_some(&p.a),
            &[
                "probe", "tcp-rr", host, "-p", port, "-l", "2", "-w", "5ms", "-q",
            ],
        )
    };
    let clients = [
        rr(B_ADDR, "7101"),
        rr("10.78.0.2", "7102"),
        rr(A_ADDR, "7103"),
        rr("127.0.0.1", "7104"),
    ];
    for cl in clients {
        let out = cl.wait_output(Duration::from_secs(20)).unwrap();
        assert!(
            out.status.success(),
            "probe: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    let body = scrape_in(&p.a, METRICS_PORT).expect("scrape");
    let body_s = scrape_in(&p.a, METRICS_PORT_S).expect("scrape");
    let out = obs.wait_output(Duration::from_secs(20)).unwrap();
    let out_s = obs_s.wait_output(Duration::from_secs(20)).unwrap();
    let lines_s = parse_lines(&out_s.stdout).unwrap();
    let doc_s: Value =
        serde_json::from_str(&std::fs::read_to_string(&result_s).unwrap_or_default())
            .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&result_s);
    let lines = parse_lines(&out.stdout).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap_or_default())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&result);

    Seen {
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
        err_s: String::from_utf8_lossy(&out_s.stderr).into_owned(),
        body,
        body_s,
        lines,
        lines_s,
        doc,
        doc_s,
    }
}

/// The servers' series of the TCP view found in /metrics (pod, CRI-O container, service).
struct Owners {
    pod: Labels,
    crio: Labels,
    svc: Labels,
}

/// /metrics: each server's series with its owner's labels, its namespace named by its owner.
fn assert_server_series_carry_their_owners(
    seen: &Seen,
    a_name: &str,
    (pod_ns, crio_ns): (&String, &String),
) -> Owners {
    let err = &seen.err;
    let all = series(&seen.body, "tcp");
    let find = |port: &str, side: &str| {
        all.iter()
            .find(|m| m["local_port"] == port && m["side"] == side)
            .cloned()
    };
    let pod =
        find("7101", "server").unwrap_or_else(|| panic!("no pod server series: {all:#?}\n{err}"));
    assert_eq!(
        (
            pod.get("pod_namespace"),
            pod.get("pod"),
            pod.get("qos"),
            pod.get("container"),
            pod.get("netns")
        ),
        (
            Some(&"shop".into()),
            Some(&"checkout-0".into()),
            Some(&"burstable".into()),
            Some(&CTR_POD[..12].to_string()),
            Some(pod_ns)
        ),
        "{pod:?}"
    );
    let crio = find("7102", "server").unwrap_or_else(|| panic!("no CRI-O server series: {all:#?}"));
    assert_eq!(
        (crio.get("container"), crio.get("netns"), crio.get("pod")),
        (Some(&CTR_CRIO[..12].to_string()), Some(crio_ns), None),
        "{crio:?}"
    );
    // The same service's second server on the host's loopback: its namespace is `host`.
    let host = find("7104", "server").unwrap_or_else(|| panic!("no host series: {all:#?}"));
    assert_eq!(
        (host.get("unit"), host.get("netns")),
        (Some(&"rts-web.service".into()), Some(&"host".into())),
        "{host:?}"
    );
    let svc = find("7103", "server").unwrap_or_else(|| panic!("no service series: {all:#?}"));
    assert_eq!(
        (svc.get("unit"), svc.get("container"), svc.get("netns")),
        (
            Some(&"rts-web.service".into()),
            None,
            Some(&a_name.to_string())
        ),
        "{svc:?}"
    );
    Owners { pod, crio, svc }
}

/// The clients' side (in namespace a): their own scope, never the server's owner (the test's
/// own scrapes of /metrics, to 127.0.0.1, are not theirs).
fn assert_client_series_carry_the_clients_scope(seen: &Seen, a_name: &str) {
    let all = series(&seen.body, "tcp");
    let cli: Vec<_> = all
        .iter()
        .filter(|m| {
            m["side"] == "client" && m["netns"] == a_name && m["remote_prefix"] != "127.0.0.0/24"
        })
        .collect();
    assert!(
        !cli.is_empty()
            && cli.iter().all(
                |m| m.get("unit") == Some(&"rts-client.scope".into()) && m.get("pod").is_none()
            ),
        "{cli:#?}"
    );
}

/// The sampler's flows of the same servers and clients carry the same labels as the TCP
/// view's: with both views, and with the sampler alone.
fn assert_sampler_series_carry_the_same_labels(seen: &Seen, owners: &Owners, a_name: &str) {
    let (err, err_s) = (&seen.err, &seen.err_s);
    let (pod, crio, svc) = (&owners.pod, &owners.crio, &owners.svc);
    let sampled = series(&seen.body, "sampler");
    let sampled_alone = series(&seen.body_s, "sampler");
    for (sampled, how) in [(&sampled, "with the TCP view"), (&sampled_alone, "alone")] {
        for (port, want) in [("7101", pod), ("7102", crio), ("7103", svc)] {
            let got = sampled
                .iter()
                .find(|m| m["local_port"] == port && m["side"] == "server")
                .unwrap_or_else(|| {
                    panic!("no sampler series of {port} ({how}): {sampled:#?}\n{err}\n{err_s}")
                });
            let mut want = want.clone();
            want.insert("view".into(), "sampler".into());
            assert_eq!(
                got, &want,
                "the sampler's {port} server series ({how}) vs the TCP view's"
            );
            eprintln!("sampler {port} server series ({how}): {got:?}");
        }
        let scli: Vec<_> = sampled
            .iter()
            .filter(|m| {
                m["side"] == "client"
                    && m["netns"] == a_name
                    && m["local_port"] == "other"
                    && m["remote_prefix"] != "127.0.0.0/24"
            })
            .collect();
        assert!(
            !scli.is_empty()
                && scli
                    .iter()
                    .all(|m| m.get("unit") == Some(&"rts-client.scope".into())
                        && m.get("pod").is_none()),
            "sampler client series ({how}): {scli:#?}"
        );
    }
}

/// observe --format json: the interval rows; the result document: every flow's details. Both
/// observers (the second has only sampler rows).
fn assert_rows_and_documents_name_the_owners(seen: &Seen, uid: &str, pod_ns: &str) {
    for (lines, doc, how) in [
        (&seen.lines, &seen.doc, "both views"),
        (&seen.lines_s, &seen.doc_s, "sampler alone"),
    ] {
        let row = |port: &str| server_row(lines, port, how == "sampler alone");
        let r = row("7101").unwrap_or_else(|| panic!("no pod row in --format json ({how})"));
        assert_eq!(
            (
                &r["workload"]["pod_uid"],
                &r["workload"]["pod_name"],
                &r["workload"]["runtime"]
            ),
            (
                &Value::from(uid),
                &Value::from("checkout-0"),
                &Value::from("containerd")
            ),
            "{how}: {r}"
        );
        assert_eq!(r["netns_name"], pod_ns, "{how}");
        assert_eq!(
            row("7102").unwrap()["workload"]["runtime"],
            "cri-o",
            "{how}"
        );
        assert_eq!(
            row("7103").unwrap()["workload"]["unit"],
            "rts-web.service",
            "{how}"
        );
        let text = doc.to_string();
        for want in [uid, "checkout-0", CTR_CRIO, "rts-web.service", pod_ns] {
            assert!(
                text.contains(want),
                "the result document ({how}) names {want}"
            );
        }
    }
}

/// The first interval row of the server end of local port `port` (with
/// sampler statistics when `sampled`).
fn server_row(lines: &[Value], port: &str, sampled: bool) -> Option<Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["flows"].as_array().unwrap())
        .find(|r| {
            r["local"]
                .as_str()
                .is_some_and(|l| l.ends_with(&format!(":{port}")))
                && r["side"] == "server"
                && (!sampled || !r["sampler"].is_null())
        })
        .cloned()
}
