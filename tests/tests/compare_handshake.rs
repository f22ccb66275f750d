//! `rttscope compare --tcp-connect` on the lab's emulated path (10 ms each way: a 20 ms RTT, the
//! lab's NFQUEUE emulator): the handshakes stand beside the other views as the path's baseline,
//! their row within 5 % of the configured RTT (the emulator adds 0.1-0.3 ms of its own), and
//! the handshakes' own connections stay out of the TCP view's rows, which hold the TCP_RR
//! probe's transactions only (±1 per side: the last response's ACK may fall after the window).
//! With a 30 ms think time (`-w 30ms`), the server's TCP RTT times the client's delayed ACK,
//! while the handshakes and the client side stay on the path: `--explain` says so with numbers.
use std::time::Duration;

use rttscope::lab::emulator::{Impairment, LinkConfig};
use rttscope::lab::testbed::{Role, Testbed, SRV_ADDR};
use rttscope_e2e::{require_root, rttscope_bin};

const PORT: u16 = 7878;
const RTT_MS: f64 = 20.0;

/// The table row `view`: its N and P50 (ms).
fn row(text: &str, view: &str) -> (u64, f64) {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{view} ")))
        .unwrap_or_else(|| panic!("no row {view}:\n{text}"));
    let cols: Vec<&str> = line[view.len()..].split_whitespace().collect();
    (
        cols[0].parse().unwrap(),
        cols[4].parse().unwrap_or(f64::NAN),
    )
}

#[test]
fn handshakes_are_the_paths_baseline_beside_the_other_views() {
    if !require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let mut imp = Impairment::new(&tb).unwrap();
    imp.set_both(LinkConfig::delay(Duration::from_millis(10)))
        .unwrap();
    let bin = rttscope_bin();
    let listen = format!("{SRV_ADDR}:{PORT}");
    tb.spawn(
        Role::Srv,
        &[bin.to_str().unwrap(), "serve", "--listen", &listen],
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let srv = SRV_ADDR.to_string();
    let out = tb
        .command(Role::Cli, bin.to_str().unwrap())
        .args(["compare", &srv, "-l", "4s", "-w", "30ms", "--tcp-connect"])
        .args(["--explain", "-q"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "compare failed:\n{text}");
    eprintln!("{text}");
    let (hs_n, hs_p50) = row(&text, "TCP_CONNECT");
    let (rr_n, rr_p50) = row(&text, "TCP_RR");
    // 4 s at 30 ms between handshakes (each ~20 ms): ~80; at least half.
    assert!(hs_n >= 40, "{hs_n} handshakes:\n{text}");
    assert!(
        (hs_p50 - RTT_MS).abs() <= 0.05 * RTT_MS,
        "handshake p50 {hs_p50} ms, {RTT_MS} ms configured:\n{text}"
    );
    assert!(rr_p50 >= 0.95 * RTT_MS, "TCP_RR p50 {rr_p50} ms:\n{text}");
    // the handshakes' connections are in no TCP row: each holds the TCP_RR probe's transactions
    for view in ["tcp client", "tcp server"] {
        let (n, _) = row(&text, view);
        assert!(
            (n as i64 - rr_n as i64).abs() <= 1,
            "row {view} has {n} samples for TCP_RR's {rr_n} transactions:\n{text}"
        );
    }
    // the client side on the path with the handshakes, the server side at the think time
    let (_, client_p50) = row(&text, "tcp client");
    assert!(
        (client_p50 - hs_p50).abs() <= 0.05 * RTT_MS,
        "client-side RTT p50 {client_p50} ms vs handshakes' {hs_p50} ms:\n{text}"
    );
    assert!(
        text.contains("note: server-side TCP RTT p50"),
        "the delayed-ACK note:\n{text}"
    );
    assert!(
        !text.contains("above the handshake's p50"),
        "no note of a client side or TCP_RR above the path (both on it):\n{text}"
    );
    drop(imp);
}
