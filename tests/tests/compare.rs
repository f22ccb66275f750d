//! `rttscope compare` between two namespaces on a busy host: every view filled with exactly the
//! probes' own transactions (other connections to the same port, pings and other namespaces'
//! traffic run beside it), the JSON result rendered by `rttscope chart`.
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
    // Long-lived connections to the same port (probe tcp-rr -w 10ms), pings to the same host,
    // and traffic in other namespaces, all opened before compare attaches.
    let busy = busy::BusyHost::start(
        &p,
        format!("{B_ADDR}:7878").parse().unwrap(),
        busy::Responder::Rttscope,
    )
    .unwrap();
    let dir = std::env::temp_dir().join(unique("rtscmp"));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("result.json");
    let text = compare_beside_it(&p, &json);
    eprintln!("{text}\n{}", busy.describe());
    assert_every_row_holds_its_probes_own(&text, &busy);
    assert_the_result_loads_in_the_probes_window(&json);
    assert_chart_draws(&json, &dir.join("chart.png"));
    outputs_chain(&p, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `compare` from a to b for 3 s (TCP_RR, UDP_RR, ICMP; every view; `--explain`), its result
/// saved to `json`: its table (it must exit 0).
fn compare_beside_it(p: &Pair, json: &std::path::Path) -> String {
    let bin = rttscope_bin();
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
    .arg(json);
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
    text
}

/// A row's sample count in compare's table.
fn n_of(text: &str, view: &str, busy: &busy::BusyHost) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{view} ")))
        .unwrap_or_else(|| panic!("no row {view}: {text}\n{}", busy.describe()));
    line[view.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Every view has a row with samples, each passive row exactly its probe's transactions
/// (however much else runs on the host), what was left out said, the delayed-ACK note.
fn assert_every_row_holds_its_probes_own(text: &str, busy: &busy::BusyHost) {
    let n_of = |view: &str| n_of(text, view, busy);
    // Every view has a row with samples.
    for view in ["sampler cloud", "TCP_RR", "UDP_RR", "ICMP"] {
        let n = n_of(view);
        assert!(
            n >= 50,
            "row {view} has {n} samples (3 s at 20 ms: ~150): {text}"
        );
    }
    // These flows only: each passive row holds one sample per transaction of the probe it
    // watches (+-1 per side: the last response's ACK may fall after the window), however much
    // else runs on the host.
    let (rr, icmp) = (n_of("TCP_RR") as i64, n_of("ICMP") as i64);
    for (view, own) in [
        ("tcp client", rr),
        ("tcp server", rr),
        ("sampler client", rr),
        ("sampler icmp", icmp),
    ] {
        let n = n_of(view) as i64;
        assert!(
            (n - own).abs() <= 1,
            "row {view} has {n} samples for its probe's {own} transactions: {text}\n{}",
            busy.describe()
        );
    }
    if busy::enabled() {
        assert!(
            text.contains("passive sample(s) of other traffic"),
            "--explain says what was left out: {text}"
        );
    }
    // The delayed-ACK note, with its numbers (20 ms think time, server side).
    assert!(
        text.contains("note: server-side TCP RTT p50"),
        "expected the delayed-ACK note: {text}"
    );
}

/// The saved result loads, with its settings, and no passive sample lies outside the TCP
/// probe's window.
fn assert_the_result_loads_in_the_probes_window(json: &std::path::Path) {
    // The saved result loads and renders.
    let r = rttscope::analysis::results::RunResult::load(json).unwrap();
    assert!(
        r.views.len() >= 6,
        "{:?}",
        r.views.iter().map(|v| &v.name).collect::<Vec<_>>()
    );
    assert!(r.settings["tcp_view"]["prog_ids"].is_array());
    // The same window: no passive sample before the TCP probe's first transaction (time 0) or
    // after the end of its last one.
    let probe = r.views.iter().find(|v| v.name == "TCP_RR").unwrap();
    let end_s = probe
        .samples
        .iter()
        .map(|s| s.t_s() + s.rtt_us / 1e6)
        .fold(0.0, f64::max);
    for v in r.views.iter().filter(|v| v.name.starts_with("tcp ")) {
        let (lo, hi) = v.samples.iter().fold((f64::MAX, 0.0f64), |(lo, hi), s| {
            (lo.min(s.t_s()), hi.max(s.t_s()))
        });
        assert!(
            lo >= 0.0 && hi <= end_s + 0.001,
            "{}: samples from {lo:.4} s to {hi:.4} s, the probe's window 0 to {end_s:.4} s",
            v.name
        );
    }
}

/// `rttscope chart` draws the saved result as a PNG.
fn assert_chart_draws(json: &std::path::Path, png: &std::path::Path) {
    let bin = rttscope_bin();
    let st = Command::new(&bin)
        .args(["chart"])
        .arg(json)
        .arg("-o")
        .arg(png)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(png).unwrap();
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG"),
        "chart is a PNG of {} bytes",
        bytes.len()
    );
}

/// Outputs chain: `--json -` puts the result alone on stdout (the table on stderr), and `chart`
/// draws what `probe --json -` writes.
fn outputs_chain(p: &Pair, dir: &std::path::Path) {
    let bin = rttscope_bin();
    let mut cmd = p.a.command(bin.to_str().unwrap());
    cmd.args(["compare", B_ADDR, "-l", "1", "-w", "20", "--json", "-"]);
    let out = ChildGuard::spawn(&mut cmd)
        .unwrap()
        .wait_output(Duration::from_secs(60))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "compare --json -: {stdout} {stderr}");
    let r = rttscope::analysis::results::RunResult::from_json(&stdout, "<stdout>")
        .unwrap_or_else(|e| panic!("stdout is one result: {e}: {stdout}"));
    assert!(r.views.iter().any(|v| v.name == "TCP_RR"), "{stdout}");
    assert!(stderr.contains("TCP_RR"), "the table on stderr: {stderr}");
    let probe =
        p.a.exec(&[
            bin.to_str().unwrap(),
            "probe",
            "tcp-rr",
            B_ADDR,
            "-n",
            "50",
            "--json",
            "-",
        ])
        .unwrap();
    let pj = dir.join("probe.json");
    std::fs::write(&pj, &probe.stdout).unwrap();
    let png = dir.join("probe.png");
    let out = Command::new(&bin)
        .args(["chart"])
        .arg(&pj)
        .arg("-o")
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success() && std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0) > 10_000,
        "chart of probe --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
