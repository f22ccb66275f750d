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

/// `rttscope ARGS` started inside cgroup `cg` and network namespace `ns`:
/// the shell moves itself into the cgroup, then becomes nsenter, then rttscope.
fn spawn_in(cg: &Path, ns: &NetNs, args: &[&str]) -> ChildGuard {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec nsenter --net=/var/run/netns/{} {} {}",
        cg.display(),
        ns.name,
        rttscope_bin().display(),
        args.join(" ")
    );
    ChildGuard::spawn(Command::new("sh").args(["-c", &script])).unwrap()
}

fn scrape_in(ns: &NetNs) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], METRICS_PORT));
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

/// The label sets (as maps) of RTT series of the TCP view with samples.
fn series(body: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    let s = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    s.samples
        .iter()
        .filter(|x| x.metric == "rttscope_rtt_seconds" && x.labels.get("view") == Some("tcp"))
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

/// A veth pair between `a` (10.78.0.1/24) and `c` (10.78.0.2/24).
fn link(a: &NetNs, c: &NetNs) {
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
    link(&p.a, &c);
    let _pod_srv = spawn_in(
        &pod_cg,
        &p.b,
        &["serve", "--listen", &format!("{B_ADDR}:7101")],
    );
    let _crio_srv = spawn_in(&crio_cg, &c, &["serve", "--listen", "10.78.0.2:7102"]);
    let _svc_srv = spawn_in(
        &svc_cg,
        &p.a,
        &["serve", "--listen", &format!("{A_ADDR}:7103")],
    );

    let result = std::env::temp_dir().join(format!("{}.json", unique("rtswl")));
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{}", p.a.name))
        .env("RTTSCOPE_POD_LOG_DIR", &logs)
        .arg(rttscope_bin())
        .args([
            "observe",
            "--label-workload",
            "--format",
            "json",
            "--interval",
            "500ms",
            "--duration",
            "7s",
        ])
        .args([
            "--listen",
            &format!("127.0.0.1:{METRICS_PORT}"),
            "--label-port",
            "7101",
        ])
        .args(["--label-port", "7102", "--label-port", "7103", "-o"])
        .arg(&result);
    let obs = ChildGuard::spawn(&mut cmd).unwrap();
    let t0 = Instant::now();
    while scrape_in(&p.a).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "observer did not serve /metrics"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let rr = |host: &str, port: &str| -> ChildGuard {
        spawn_in(
            &cli_cg,
            &p.a,
            &[
                "probe", "tcp-rr", host, "-p", port, "-l", "2", "-w", "5ms", "-q",
            ],
        )
    };
    let clients = [
        rr(B_ADDR, "7101"),
        rr("10.78.0.2", "7102"),
        rr(A_ADDR, "7103"),
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
    let body = scrape_in(&p.a).expect("scrape");
    let out = obs.wait_output(Duration::from_secs(20)).unwrap();
    let lines = parse_lines(&out.stdout).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap_or_default())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&result);
    let _ = std::fs::remove_dir_all(&logs);
    let err = String::from_utf8_lossy(&out.stderr);

    let pod_ns = "pod:shop/checkout-0".to_string();
    let crio_ns = format!("container:{}", &CTR_CRIO[..12]);
    let all = series(&body);
    let find = |port: &str, side: &str| {
        all.iter()
            .find(|m| m["local_port"] == port && m["side"] == side)
            .cloned()
    };
    // /metrics: each server's series with its owner's labels, its namespace named by its owner.
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
            Some(&pod_ns)
        ),
        "{pod:?}"
    );
    let crio = find("7102", "server").unwrap_or_else(|| panic!("no CRI-O server series: {all:#?}"));
    assert_eq!(
        (crio.get("container"), crio.get("netns"), crio.get("pod")),
        (Some(&CTR_CRIO[..12].to_string()), Some(&crio_ns), None),
        "{crio:?}"
    );
    let svc = find("7103", "server").unwrap_or_else(|| panic!("no service series: {all:#?}"));
    assert_eq!(
        (svc.get("unit"), svc.get("container"), svc.get("netns")),
        (Some(&"rts-web.service".into()), None, Some(&p.a.name)),
        "{svc:?}"
    );
    // The clients' side (in namespace a): their own scope, never the server's owner
    // (the test's own scrapes of /metrics, to 127.0.0.1, are not theirs).
    let cli: Vec<_> = all
        .iter()
        .filter(|m| {
            m["side"] == "client" && m["netns"] == p.a.name && m["remote_prefix"] != "127.0.0.0/24"
        })
        .collect();
    assert!(
        !cli.is_empty()
            && cli.iter().all(
                |m| m.get("unit") == Some(&"rts-client.scope".into()) && m.get("pod").is_none()
            ),
        "{cli:#?}"
    );

    // observe --format json: the interval rows; the result document: every flow's details.
    let rows: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .flat_map(|l| l["flows"].as_array().unwrap())
        .collect();
    let row = |port: &str| {
        rows.iter()
            .find(|r| {
                r["local"]
                    .as_str()
                    .is_some_and(|l| l.ends_with(&format!(":{port}")))
                    && r["side"] == "server"
            })
            .copied()
    };
    let r = row("7101").unwrap_or_else(|| panic!("no pod row in --format json: {rows:#?}"));
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
        "{r}"
    );
    assert_eq!(r["netns_name"], pod_ns.as_str());
    assert_eq!(row("7102").unwrap()["workload"]["runtime"], "cri-o");
    assert_eq!(row("7103").unwrap()["workload"]["unit"], "rts-web.service");
    let text = doc.to_string();
    for want in [
        uid,
        "checkout-0",
        CTR_CRIO,
        "rts-web.service",
        pod_ns.as_str(),
    ] {
        assert!(text.contains(want), "the result document names {want}");
    }
}
