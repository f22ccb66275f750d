//! The shipped deployment (examples/deploy/): the capability set that the
//! systemd unit and the DaemonSet declare is read from those files, and the
//! daemon is started with exactly that set (setpriv), in its own network
//! namespace as on a host (nsenter, which leaves /sys as it is, unlike
//! `ip netns exec`), then scraped. Truth: real TCP request/response traffic
//! the test runs, and the process's own /proc status.
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use prometheus_parse::{Scrape, Value};
use rttscope_e2e::*;

const PORT: u16 = 5001;
const METRICS_PORT: u16 = 9464;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy")
}

/// Capabilities (lower case, no CAP_ prefix) on a `Key=CAP_A CAP_B` line of the unit.
fn unit_caps(unit: &str, key: &str) -> BTreeSet<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .flat_map(|v| v.split_whitespace())
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect()
}

/// Capabilities in the DaemonSet's `add: ["BPF", ...]` line.
fn daemonset_caps(yaml: &str) -> BTreeSet<String> {
    let line = yaml
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("add:"))
        .expect("DaemonSet has a capabilities add: line");
    line.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|c| c.trim().trim_matches('"').to_lowercase())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The one capability set both shipped deployments declare.
fn declared_caps() -> BTreeSet<String> {
    let unit = std::fs::read_to_string(deploy_dir().join("rttscope.service")).unwrap();
    let yaml = std::fs::read_to_string(deploy_dir().join("rttscope-daemonset.yaml")).unwrap();
    let bounding = unit_caps(&unit, "CapabilityBoundingSet");
    let ambient = unit_caps(&unit, "AmbientCapabilities");
    let ds = daemonset_caps(&yaml);
    assert!(!bounding.is_empty(), "the unit declares a bounding set");
    assert_eq!(bounding, ambient, "unit: bounding and ambient sets");
    assert_eq!(
        bounding, ds,
        "the unit and the DaemonSet grant the same set"
    );
    bounding
}

#[test]
fn deployments_declare_one_capability_set() {
    let caps = declared_caps();
    let want: BTreeSet<String> = ["bpf", "net_admin", "perfmon"].map(String::from).into();
    assert_eq!(caps, want);
}

#[test]
fn systemd_unit_verifies() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("systemd-analyze is missing (scripts/setup.sh installs systemd)");
    }
    // The unit as shipped, with ExecStart pointing at the binary under test.
    let unit = std::fs::read_to_string(deploy_dir().join("rttscope.service")).unwrap();
    let bin = rttscope_bin();
    let dir = std::env::temp_dir().join(unique("rtsunit"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rttscope.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/rttscope", bin.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("rttscope")).collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {:?}\n{err}",
        out.status
    );
}

/// GET /metrics from inside `ns` (the daemon listens on its loopback).
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

/// Total count of the RTT histograms of `view`.
fn rtt_count(body: &str, view: &str) -> f64 {
    let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
    let s = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("parse");
    s.samples
        .iter()
        .filter(|x| x.metric == "rttscope_rtt_seconds" && x.labels.get("view") == Some(view))
        .map(|x| match &x.value {
            Value::Histogram(h) => h.last().map_or(0.0, |b| b.count),
            _ => 0.0,
        })
        .sum()
}

/// Effective capability mask and NoNewPrivs of a process.
fn proc_caps(pid: u32) -> (u64, bool) {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        st.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    (
        u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(u64::MAX),
        field("NoNewPrivs:") == "1",
    )
}

fn cap_bit(name: &str) -> u64 {
    match name {
        "net_admin" => 1 << 12,
        "perfmon" => 1 << 38,
        "bpf" => 1 << 39,
        other => panic!("unknown capability {other}"),
    }
}

/// The daemon as deployed: the shipped config, exactly the declared
/// capabilities (uid 0 as both deployments run it), in the namespace it
/// observes, with the TCP view and the sampler on a local interface. It must
/// start, attach, serve /metrics with samples of real traffic, and hold no
/// capability beyond the declared set.
#[test]
fn daemon_runs_with_exactly_the_declared_capabilities() {
    if !require_root() {
        return;
    }
    let caps = declared_caps();
    let set = caps
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(",");
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:{PORT}").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/var/run/netns/{}", p.a.name))
        .arg("setpriv")
        .arg(format!("--bounding-set=-all,{set}"))
        .arg(rttscope_bin())
        .args(["observe", "--config"])
        .arg(deploy_dir().join("rttscope.toml"))
        .args(["--listen", &format!("127.0.0.1:{METRICS_PORT}")])
        .args(["--interval", "300ms", "--duration", "60s"])
        .args(["--view", "tcp,sampler", "--iface", &p.a_if]);
    let obs = ChildGuard::spawn(&mut cmd).unwrap();
    let t0 = Instant::now();
    while scrape_in(&p.a).is_err() {
        if t0.elapsed() > Duration::from_secs(15) {
            let out = obs.wait_output(Duration::from_secs(2)).unwrap();
            panic!(
                "the daemon with capabilities {set} did not serve /metrics within 15 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (eff, nnp) = proc_caps(obs.pid());
    let allowed: u64 = caps.iter().map(|c| cap_bit(c)).sum();
    assert_eq!(
        eff & !allowed,
        0,
        "effective capabilities {eff:#x} beyond the declared {allowed:#x}"
    );
    assert!(nnp, "no_new_privs set after attach");

    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    cli.pause();
    std::thread::sleep(Duration::from_millis(700));
    let body = scrape_in(&p.a).expect("scrape");
    let (tcp, sampler) = (rtt_count(&body, "tcp"), rtt_count(&body, "sampler"));
    drop(obs);
    eprintln!("deploy caps {set}: tcp {tcp} samples, sampler {sampler}");
    assert!(
        tcp >= 50.0 && sampler >= 50.0,
        "samples of the RR traffic in both views: tcp {tcp}, sampler {sampler}; scrape:\n{body}"
    );
}

/// Without CAP_SYS_ADMIN, a namespace other than the process's own cannot be
/// entered: one sentence that says so, and a non-zero exit.
#[test]
fn other_namespace_without_sys_admin_is_one_sentence() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let out = Command::new("setpriv")
        .arg("--bounding-set=-all,+bpf,+perfmon,+net_admin")
        .arg(rttscope_bin())
        .args([
            "observe",
            "--duration",
            "1s",
            "--view",
            "sampler",
            "--iface",
        ])
        .arg(format!("{}:{}", p.a.name, p.a_if))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {err}");
    assert!(
        err.contains("needs CAP_SYS_ADMIN") && err.trim().lines().count() == 1,
        "one sentence naming the capability: {err}"
    );
}
