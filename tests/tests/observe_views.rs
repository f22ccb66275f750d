//! Both passive views through `rttscope observe`, joined on the same flows.
use std::net::SocketAddr;
use std::time::Duration;

use rttscope_e2e::*;

#[test]
fn sampler_and_tcp_view_agree_on_the_client_side() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5002").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(1)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let ia = format!("{}:{}", p.a.name, p.a_if);
    let ib = format!("{}:{}", p.b.name, p.b_if);
    let lines = observe_json(
        &[
            "--netns",
            &p.a.name,
            "--netns",
            &p.b.name,
            "--view",
            "tcp,sampler",
            "--iface",
            &ia,
            "--iface",
            &ib,
            "--interval",
            "1s",
            "--duration",
            "3s",
        ],
        Duration::from_secs(30),
    )
    .unwrap();
    let start = &lines[0];
    assert_eq!(
        start["views"],
        serde_json::json!(["tcp", "sampler"]),
        "{start}"
    );
    assert_eq!(start["sampler"]["settings"]["sample_every"], 1, "{start}");
    assert_eq!(start["sampler"]["settings"]["matching"], "seq", "{start}");
    let f = end_flow(&lines, &p.a.name, &cli.local.to_string())
        .unwrap_or_else(|| panic!("client flow missing: {lines:#?}"));
    let tcp50 = f["tcp"]["summary"]["p50_us"].as_f64().unwrap();
    let smp50 = f["sampler"]["summary"]["p50_us"]
        .as_f64()
        .unwrap_or_else(|| panic!("no sampler stats on the client row: {f}"));
    // The sampler sits below IP: it misses the stack time inside TCP's own
    // samples, a few microseconds that matter at a ~50 us RTT: 20% + 10 us.
    let tol = 0.2 * tcp50 + 10.0;
    assert!((smp50 - tcp50).abs() <= tol, "client side: sampler p50 {smp50:.1} us vs TCP view p50 {tcp50:.1} us (tolerance {tol:.1} us): {f}");
    // Every interval row that has sampler stats also names the view's settings in the start line;
    // the interval lines carry the sampler's counters.
    let iv = lines.iter().find(|l| l["type"] == "interval").unwrap();
    assert!(
        iv["counters"]["sampler"]["samples"].as_u64().unwrap() > 0,
        "{iv}"
    );
}
