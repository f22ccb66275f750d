//! `observe --quiet` (issue 27 item 5): nothing on standard output but what an option sent
//! there explicitly (`--json -`); raw samples only into the result document that asked for
//! them. Real flows between two namespaces, both passive views with `--raw`, with the busy-host
//! load on (`RTTSCOPE_E2E_BUSY=0` turns it off).
use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use rttscope_e2e::*;

fn observe(args: &[&str]) -> Output {
    let mut cmd = Command::new(rttscope_bin());
    cmd.arg("observe").args(args).env_remove("RUST_LOG");
    ChildGuard::spawn(&mut cmd)
        .unwrap()
        .wait_output(Duration::from_secs(60))
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Raw samples per series of a result document: (name, number of samples).
fn raw_counts(doc: &serde_json::Value) -> Vec<(String, usize)> {
    doc["views"]
        .as_array()
        .unwrap_or_else(|| panic!("no views: {doc}"))
        .iter()
        .map(|v| {
            let n = v["samples"].as_array().map_or(0, |s| s.len());
            (v["name"].as_str().unwrap_or("?").to_string(), n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn assert_has_raw(doc: &serde_json::Value, what: &str) {
    let counts = raw_counts(doc);
    eprintln!("{what}: raw samples per series {counts:?}");
    for view in ["tcp ", "sampler "] {
        assert!(
            counts.iter().any(|(n, c)| n.starts_with(view) && *c > 0),
            "{what}: no raw {view}samples in the document: {counts:?}"
        );
    }
}

#[test]
fn quiet_sends_raw_samples_only_into_the_document() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5011").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let _cli = RrClient::start(&p.a, server, 2, Duration::from_millis(2)).unwrap();
    // The busy host's load (issue 27): other flows to the same port, pings, other namespaces.
    // --quiet must keep their raw samples off stdout too.
    let busy = busy::BusyHost::start(&p, server, busy::Responder::Plain { resp: 2 }).unwrap();
    eprintln!("{}", busy.describe());
    std::thread::sleep(Duration::from_millis(200));
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let ib = format!("{}:{}", p.b.name, p.b_if);
    let dir = std::env::temp_dir().join(unique("rtsquiet"));
    std::fs::create_dir_all(&dir).unwrap();
    let _rm = scopeguard(dir.clone());
    let file = dir.join("run.json");
    let f = file.to_str().unwrap();
    let base = [
        "--netns",
        &p.a.name,
        "--netns",
        &p.b.name,
        "--port",
        "5011",
        "--view",
        "tcp,sampler",
        "--iface",
        &ia,
        "--iface",
        &ib,
        "--raw",
        "--interval",
        "500ms",
        "--duration",
        "2s",
    ];

    // Without --quiet, the same run prints its raw samples (so the test can tell).
    let mut loud = base.to_vec();
    loud.extend(["--json", f]);
    let o = observe(&loud);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("raw tcp"), "loud run, no raw tcp line: {out}");
    assert!(
        out.contains("raw sampler"),
        "loud run, no raw sampler line: {out}"
    );
    std::fs::remove_file(&file).unwrap();

    // --quiet --raw --json FILE: not one byte on stdout or stderr; the samples are in FILE.
    let mut q = base.to_vec();
    q.extend(["--quiet", "--json", f]);
    let o = observe(&q);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "", "--quiet --json FILE: stdout");
    assert_eq!(text(&o.stderr), "", "--quiet --json FILE: stderr");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_has_raw(&doc, "--quiet --json FILE");

    // --quiet --raw --json -: stdout is the document and nothing else; stderr stays empty.
    let mut q = base.to_vec();
    q.extend(["--quiet", "--json", "-"]);
    let o = observe(&q);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr), "", "--quiet --json -: stderr");
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one document ({e}): {}", text(&o.stdout)));
    assert_has_raw(&doc, "--quiet --json -");
}

/// `--quiet` with a format of standard output is a contradiction: one sentence, non-zero exit,
/// nothing attached.
#[test]
fn quiet_with_a_stdout_format_is_refused() {
    for format in ["json", "cloud-monitoring"] {
        let o = observe(&["--quiet", "--format", format, "--duration", "1s"]);
        let e = text(&o.stderr);
        assert!(!o.status.success(), "--format {format}: {e}");
        assert_eq!(text(&o.stdout), "", "--format {format}");
        assert!(
            e.contains(&format!("--quiet prints nothing on standard output, so --format {format} would have nothing to print")),
            "--format {format}: {e}"
        );
        assert_eq!(e.trim_end().lines().count(), 1, "one sentence: {e}");
    }
}

/// Removes the test's directory on drop (also when an assertion fails).
struct RmDir(std::path::PathBuf);

fn scopeguard(p: std::path::PathBuf) -> RmDir {
    RmDir(p)
}

impl Drop for RmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
