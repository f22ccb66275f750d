//! `rttscope compare` between two namespaces: every view filled, the JSON
//! result rendered by `rttscope chart`.
use std::process::Command;
use std::time::Duration;

use rttscope_e2e::*;

#[test]
fn compare_fills_every_view_and_charts() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let bin = rttscope_bin();
    let mut serve = p.b.command(bin.to_str().unwrap());
    serve.args(["serve", "--listen", &format!("{B_ADDR}:7878")]);
    let _srv = ChildGuard::spawn(&mut serve).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dir = std::env::temp_dir().join(unique("rtscmp"));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("result.json");
    let mut cmd = p.a.command(bin.to_str().unwrap());
    cmd.args([
        "compare",
        B_ADDR,
        "-l",
        "3s",
        "-w",
        "20ms",
        "-r",
        "1,2",
        "--udp-rr",
        "--icmp",
        "--iface",
        &p.a_if,
        "--explain",
        "--json",
    ])
    .arg(&json);
    let out = ChildGuard::spawn(&mut cmd)
        .unwrap()
        .wait_output(Duration::from_secs(60))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "compare failed: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every view has a row with samples.
    for view in [
        "tcp client",
        "tcp server",
        "sampler client",
        "sampler cloud",
        "TCP_RR",
        "UDP_RR",
        "ICMP",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(view))
            .unwrap_or_else(|| panic!("no row {view}: {text}"));
        let n: u64 = line[view.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            n >= 50,
            "row {view} has {n} samples (3 s at 20 ms: ~150): {text}"
        );
    }
    // The delayed-ACK note, with its numbers (20 ms think time, server side).
    assert!(
        text.contains("note: server-side TCP RTT p50"),
        "expected the delayed-ACK note: {text}"
    );
    // The saved result loads and renders.
    let r = rttscope::analysis::results::RunResult::load(&json).unwrap();
    assert!(
        r.views.len() >= 6,
        "{:?}",
        r.views.iter().map(|v| &v.name).collect::<Vec<_>>()
    );
    assert!(r.settings["tcp_view"]["prog_ids"].is_array());
    let png = dir.join("chart.png");
    let st = Command::new(&bin)
        .args(["chart"])
        .arg(&json)
        .arg("-o")
        .arg(&png)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG"),
        "chart is a PNG of {} bytes",
        bytes.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
