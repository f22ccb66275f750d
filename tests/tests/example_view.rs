//! The third view plugs in (issue 24): the example view `count` (feature `example-view`,
//! docs/views.md), written as its folder, its C file and its registry line only, shows in
//! observe's JSON records, its table (header and closing line), `/metrics` and the result
//! document, with the exact numbers of packets a process of the test's own cgroup sent itself.
//!
//! Runs against a build with the feature: `RTTSCOPE_EXAMPLE_VIEW=1` and `RTTSCOPE_BIN` that
//! build (scripts/test.sh's last phase); skipped otherwise (the shipped build has no such view).
use std::process::Command;
use std::time::{Duration, Instant};

use rttscope_e2e::*;

/// Datagrams the test's process sends itself, and the bytes each puts on loopback (IPv4 20 +
/// UDP 8 + 100 of payload): each is counted once out of and once into the cgroup.
const N: u64 = 40;
const BYTES: u64 = 128;

fn enabled() -> bool {
    if std::env::var_os("RTTSCOPE_EXAMPLE_VIEW").is_none_or(|v| v != "1") {
        eprintln!("skipped: set RTTSCOPE_EXAMPLE_VIEW=1 and RTTSCOPE_BIN to a build with --features example-view");
        return false;
    }
    require_root()
}

/// A cgroup v2 directory of the test's own, removed on drop (its one process has exited).
struct Cgroup(std::path::PathBuf);

impl Cgroup {
    fn new() -> Cgroup {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let root = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
            })
            .expect("a cgroup v2 mount");
        let p = std::path::Path::new(&root).join(unique("rtsexv"));
        std::fs::create_dir(&p).unwrap();
        Cgroup(p)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A process in the cgroup sends itself N datagrams of 100 bytes over loopback and reads them.
fn send_in(cg: &Cgroup) {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec python3 -c '\
import socket\n\
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind((\"127.0.0.1\", 0))\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
for i in range({N}): s.sendto(b\"x\" * 100, r.getsockname())\n\
for i in range({N}): r.recv(200)\n'",
        cg.0.display()
    );
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(out.status.success(), "sender: {out:?}");
}

fn expect_counts(c: &serde_json::Value, what: &str) {
    for (k, want) in [
        ("packets_out", N),
        ("packets_in", N),
        ("bytes_out", N * BYTES),
        ("bytes_in", N * BYTES),
    ] {
        assert_eq!(c[k].as_u64(), Some(want), "{what}: {k} in {c}");
    }
}

/// `/metrics` once the daemon serves it, with every count of the example view.
fn scrape(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // (refused until the daemon serves: tried again)
        let out = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains(&format!("event=\"packets_in\"}} {N}")) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn the_example_view_appears_in_json_metrics_results_and_the_table() {
    if !enabled() {
        return;
    }
    let cg = Cgroup::new();
    let doc = std::env::temp_dir().join(format!("{}.json", unique("rtsexv")));
    let port = 19_000 + (std::process::id() % 1000) as u16;
    let cgs = cg.0.display().to_string();
    let args: Vec<String> = [
        "--view",
        "tcp,count",
        "--cgroup",
        &cgs,
        "--interval",
        "1s",
        "--duration",
        "5s",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        doc.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ])
    .collect();
    let obs = observe_json_attached(args, Duration::from_secs(60));
    send_in(&cg);
    let metrics = scrape(port);
    let lines = obs.join().unwrap().unwrap();
    // JSON Lines: the intervals' and the end record's counters of the view
    let c = last_interval_counters(&lines, "count");
    expect_counts(c, "last interval");
    let end = lines
        .iter()
        .find(|l| l["type"] == "end")
        .expect("end record");
    expect_counts(&end["counters"]["count"], "end record");
    // /metrics: the view's counters as events of its own label
    for (k, v) in [
        ("packets_out", N),
        ("packets_in", N),
        ("bytes_in", N * BYTES),
    ] {
        let want = format!("rttscope_view_events_total{{view=\"count\",event=\"{k}\"}} {v}");
        assert!(
            metrics.contains(&want),
            "no `{want}` in /metrics:\n{metrics}"
        );
    }
    // the result document: its counters and its hooks entry
    let d: serde_json::Value = serde_json::from_slice(&std::fs::read(&doc).unwrap()).unwrap();
    let _ = std::fs::remove_file(&doc);
    expect_counts(&d["counters"]["count"], "result document");
    assert!(
        d["settings"]["hooks"]["count"]["cgroup"].is_string(),
        "hooks: {}",
        d["settings"]["hooks"]
    );
    table_shows_the_view();
}

/// The table: the view's part of the header and of the closing line.
fn table_shows_the_view() {
    let cg2 = Cgroup::new();
    let mut cmd = Command::new(rttscope_bin());
    cmd.args(["observe", "--view", "count", "--cgroup"])
        .arg(&cg2.0)
        .args(["--interval", "1s", "--duration", "4s"]);
    let mut child = ChildGuard::spawn(&mut cmd).unwrap();
    // the table's start lines end with "waiting for samples...", written once attached
    let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
    let mut r = std::io::BufReader::new(stdout);
    let mut text = String::new();
    while !text.contains("waiting for samples") {
        let mut l = String::new();
        if std::io::BufRead::read_line(&mut r, &mut l).unwrap() == 0 {
            break;
        }
        text += &l;
    }
    send_in(&cg2);
    let rest = std::thread::spawn(move || {
        let mut b = String::new();
        let _ = std::io::Read::read_to_string(&mut r, &mut b);
        b
    });
    let out = child.wait_output(Duration::from_secs(30)).unwrap();
    assert!(out.status.success(), "observe (table): {out:?}");
    text += &rest.join().unwrap();
    assert!(
        text.contains(&format!(
            "| view count: cgroup_skb @ cgroup {}",
            cg2.0.display()
        )),
        "header:\n{text}"
    );
    let closing = format!(
        "count: {N} packets ({} bytes) in, {N} packets ({} bytes) out",
        N * BYTES,
        N * BYTES
    );
    assert!(text.contains(&closing), "no `{closing}` in:\n{text}");
}
