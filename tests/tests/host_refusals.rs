//! What rttscope says when the host, not rttscope, is in the way (issue 43 item 5): a seccomp
//! filter that refuses bpf() (what a container runtime's default profile does), and PID 1's
//! network namespace out of reach (a sandbox, a container without the host's PID namespace:
//! here, a process without CAP_SYS_PTRACE, which PID 1 holds).
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rttscope_e2e::*;

/// The capabilities every kernel probe answers (the others are host checks).
const HOST_CHECKS: [&str; 3] = ["btf", "privileges", "cgroup2"];

fn under_seccomp(program: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args);
    refuse_bpf_by_seccomp(&mut cmd).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The filter is real: a child under it is in seccomp filter mode, and bpftool's own bpf()
/// calls are refused there (not outside it).
fn check_the_filter() {
    let o = under_seccomp("grep", &["^Seccomp:", "/proc/self/status"]);
    let mode = text(&o.stdout);
    assert_eq!(mode.split_whitespace().nth(1), Some("2"), "{mode}");
    let o = under_seccomp("bpftool", &["prog", "show"]);
    assert!(
        !o.status.success() && text(&o.stderr).contains("Operation not permitted"),
        "bpftool under the filter: {} {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(sh(&["bpftool", "prog", "show"]).is_ok());
}

/// Under a filter refusing bpf() with EPERM, with every capability held: `features` says in one
/// sentence that the seccomp filter refuses bpf(), and that what the kernel allows is unknown
/// (each kernel probe "?" / `probed: false`, none "no"); `observe` stops at once with one
/// sentence naming seccomp, not RLIMIT_MEMLOCK, under each loader built in. Without the filter,
/// nothing is said of seccomp.
#[test]
fn seccomp_refusing_bpf_is_named_by_features_and_observe() {
    if !require_root() {
        return;
    }
    check_the_filter();
    let bin = rttscope_bin();
    let bin = bin.to_str().unwrap();

    let o = under_seccomp(bin, &["features", "--json"]);
    assert!(!o.status.success(), "features must exit 1");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", text(&o.stdout), text(&o.stderr)));
    let why = v["bpf_refused"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(
        why.contains("seccomp filter") && why.contains("Seccomp: 2"),
        "{why}"
    );
    assert_eq!(v["observe_can_run"], false, "{v}");
    for c in v["capabilities"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if name == "privileges" {
            assert_eq!((&c["ok"], c["detail"].as_str()), (&false.into(), Some(why)));
        } else if !HOST_CHECKS.contains(&name) {
            assert_eq!(c["probed"], false, "{name} is unknown, not refused: {c}");
        }
    }
    let missing = v["views"]["missing"].as_array().unwrap();
    assert!(
        missing.len() == 1 && missing[0].as_str().unwrap().contains("seccomp"),
        "one sentence: {missing:?}"
    );

    let o = under_seccomp(bin, &["features"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let unknown: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("seccomp filter refuses"))
        .collect();
    assert_eq!(unknown.len(), 6, "each kernel probe: {out}");
    for l in unknown {
        assert!(
            l.split_whitespace().nth(1) == Some("?"),
            "unknown, not no: {l}\n{out}"
        );
    }
    assert!(
        err.trim().lines().count() == 1 && err.contains("seccomp filter"),
        "one sentence on stderr: {err}"
    );

    let version = text(&Command::new(bin).arg("--version").output().unwrap().stdout);
    let mut loaders = vec![vec![]];
    if version.contains("aya") && version.contains("libbpf") {
        loaders = vec![vec!["--loader", "libbpf"], vec!["--loader", "aya"]];
    }
    for l in loaders {
        let mut args = vec!["observe", "--duration", "1s"];
        args.extend(&l);
        let o = under_seccomp(bin, &args);
        let err = text(&o.stderr);
        assert!(!o.status.success(), "{l:?}: observe must fail: {err}");
        assert!(
            err.trim().lines().count() == 1
                && err.contains("refused by this process's seccomp filter")
                && !err.contains("RLIMIT_MEMLOCK at"),
            "{l:?}: one sentence naming seccomp: {err}"
        );
    }

    let o = Command::new(bin)
        .args(["features", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["bpf_refused"].is_null(), "no filter, no seccomp: {v}");
}

/// A request/response connection on loopback in the test's own namespace (1 byte out, 2 back,
/// every 5 ms) until dropped.
struct LoopbackRr {
    server: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LoopbackRr {
    fn start() -> LoopbackRr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(server).unwrap();
        let (mut srv, _) = listener.accept().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        for s in [&client, &srv] {
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        let answer = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while srv.read_exact(&mut b).is_ok() && srv.write_all(b"rr").is_ok() {}
        });
        let s = stop.clone();
        let ask = std::thread::spawn(move || {
            let mut b = [0u8; 2];
            while !s.load(Ordering::Relaxed)
                && client.write_all(b"q").is_ok()
                && client.read_exact(&mut b).is_ok()
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        LoopbackRr {
            server,
            stop,
            threads: vec![ask, answer],
        }
    }
}

impl Drop for LoopbackRr {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `rttscope observe --format json ARGS` without CAP_SYS_PTRACE (so PID 1's /proc/1/ns/net
/// cannot be read), run through `wrap` (a namespace to run in), to its end.
fn observe_without_ptrace(wrap: &[&str], args: &[&str]) -> Output {
    let bin = rttscope_bin();
    let mut cmd = Command::new(wrap.first().copied().unwrap_or("setpriv"));
    if let Some(rest) = wrap.get(1..) {
        cmd.args(rest).arg("setpriv");
    }
    cmd.arg("--bounding-set=-sys_ptrace")
        .arg(bin)
        .args(["observe", "--format", "json", "--interval", "1s"])
        .args(args);
    ChildGuard::spawn(&mut cmd)
        .unwrap()
        .wait_output(Duration::from_secs(60))
        .unwrap()
}

/// The start record's `tcp.netns_skipped` entries.
fn skipped(lines: &[serde_json::Value]) -> Vec<String> {
    let tcp = &lines[0]["tcp"];
    tcp["netns_skipped"]
        .as_array()
        .unwrap_or_else(|| panic!("no netns_skipped: {tcp}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn iter_netns(lines: &[serde_json::Value]) -> Vec<String> {
    serde_json::from_value(lines[0]["tcp"]["iter_netns"].clone()).unwrap()
}

/// Samples of the TCP view for the flow at (netns name, local address) over the whole run.
fn samples(lines: &[serde_json::Value], ns: &str, local: &str) -> u64 {
    let row = end_flow(lines, ns, local).unwrap_or_else(|| panic!("no flow {local} in {ns}"));
    row["tcp"]["summary"]["n"].as_u64().unwrap_or(0)
}

/// Without CAP_SYS_PTRACE, /proc/1/ns/net cannot be read (PID 1 holds it): as a container
/// without the host's PID namespace sees it. `--netns host` and `--all-netns` still run, in
/// the host's namespace through the observer's own (the initial one, by its fixed inode), and
/// the connection open before the start there is found and timed.
#[test]
fn host_namespace_is_entered_where_pid1_cannot_be_read() {
    if !require_root() {
        return;
    }
    const INIT_NET_INODE: u64 = 0xEFFF_FFF9;
    let here = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
    assert_eq!(
        here, INIT_NET_INODE,
        "the suite runs in the initial network namespace"
    );
    let o = Command::new("setpriv")
        .args(["--bounding-set=-sys_ptrace", "stat", "-L", "/proc/1/ns/net"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o.stderr).contains("Permission denied"),
        "without CAP_SYS_PTRACE PID 1's namespace must be unreadable: {}",
        text(&o.stderr)
    );
    let rr = LoopbackRr::start();
    let port = rr.server.port().to_string();
    for scope in [&["--netns", "host"][..], &["--all-netns"][..]] {
        let mut args = vec!["--port", &port, "--duration", "2s"];
        args.extend(scope);
        let o = observe_without_ptrace(&[], &args);
        assert!(o.status.success(), "{scope:?}: {}", text(&o.stderr));
        let lines = parse_lines(&o.stdout).unwrap();
        assert!(
            iter_netns(&lines).iter().any(|n| n == "host"),
            "{scope:?}: {}",
            lines[0]
        );
        assert!(
            !skipped(&lines).iter().any(|s| s.starts_with("host:")),
            "{scope:?}: {}",
            lines[0]
        );
        let n = samples(&lines, "host", &rr.server.to_string());
        assert!(
            n > 0,
            "{scope:?}: the connection open before the start is timed"
        );
    }
}

/// Run from a namespace of the test's own and without CAP_SYS_PTRACE, the observer can neither
/// read PID 1's namespace nor use its own for the host's: `--all-netns` skips 'host' with one
/// warning on stderr and an entry in the start record (`tcp.netns_skipped`), and enters every
/// other namespace (the connection open before the start between the test's two is timed on
/// both ends).
#[test]
fn all_netns_skips_a_namespace_it_cannot_enter() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5014").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(5)).unwrap();
    let wrap = ["ip", "netns", "exec", &p.a.name];
    let o = observe_without_ptrace(
        &wrap,
        &["--all-netns", "--port", "5014", "--duration", "2s"],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "the run must not end: {err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("warning: --all-netns"))
        .collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("host: opening network namespace 'host'"),
        "one warning naming host: {err}"
    );
    let lines = parse_lines(&o.stdout).unwrap();
    let host: Vec<String> = skipped(&lines)
        .into_iter()
        .filter(|s| s.starts_with("host:"))
        .collect();
    assert!(
        host.len() == 1 && host[0].contains("Permission denied"),
        "{}",
        lines[0]
    );
    let entered = iter_netns(&lines);
    assert!(
        entered.contains(&p.a.name)
            && entered.contains(&p.b.name)
            && !entered.contains(&"host".into()),
        "{entered:?}"
    );
    for (ns, local) in [
        (&p.a.name, cli.local.to_string()),
        (&p.b.name, server.to_string()),
    ] {
        assert!(
            samples(&lines, ns, &local) > 0,
            "flow {local} in {ns}: {lines:#?}"
        );
    }
}
