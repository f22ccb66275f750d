//! `rttscope features` (issue 23): the feature probes' answers on this host, and `observe`
//! taking exactly the paths they announce, under both loaders.
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use rttscope_e2e::*;

fn features() -> serde_json::Value {
    let out = Command::new(rttscope_bin())
        .args(["features", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(
        out.status.success(),
        v["observe_can_run"] == true,
        "exit status and observe_can_run disagree: {v} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    v
}

fn cap(f: &serde_json::Value, name: &str) -> bool {
    f["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no capability {name}: {f}"))["ok"]
        == true
}

/// Every capability is answered, the plan follows from the answers, and a run of `observe` with
/// a connection open before it started takes the announced paths (RTT source, existing
/// connections, sampler attachment) and times that connection on both sides, under each loader.
#[test]
fn observe_takes_the_paths_the_features_report_announces() {
    if !require_root() {
        return;
    }
    let f = features();
    assert_eq!(f["observe_can_run"], true, "{f}");
    for c in f["capabilities"].as_array().unwrap() {
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c}");
    }
    let (rtt_path, existing, attach) = paths_the_report_announces(&f);
    let p = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5012").parse().unwrap();
    let _srv = RrServer::start(&p.b, server, 2).unwrap();
    let cli = RrClient::start(&p.a, server, 2, Duration::from_millis(2)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let ia = format!("{}:{}", p.a.name, p.a_if);
    for loader in ["libbpf", "aya"] {
        let lines = observe_json(
            &[
                "--loader",
                loader,
                "--netns",
                &p.a.name,
                "--netns",
                &p.b.name,
                "--view",
                "tcp,sampler",
                "--iface",
                &ia,
                "--interval",
                "1s",
                "--duration",
                "2s",
            ],
            Duration::from_secs(60),
        )
        .unwrap();
        observe_took_them(
            &lines,
            loader,
            (rtt_path, existing, attach),
            &p,
            &cli,
            server,
        );
    }
}

/// In a network namespace whose `lo` is down (a fresh one, or a node's before its network is up)
/// no loopback connection can be made, so the TCP callback probes cannot run: `features` says
/// "not probed" ("?"), not that the kernel lacks them, and the plan is the RTT callback (the
/// kernel program takes the arguments where passed). A run of `observe` there says the same
/// and the host's answers elsewhere are unchanged.
#[test]
fn probes_that_cannot_run_say_so() {
    if !require_root() {
        return;
    }
    let host = features();
    let ns = NetNs::new("rtsfp").unwrap();
    ns.exec(&["ip", "link", "set", "lo", "down"]).unwrap();
    let out = ns
        .command(rttscope_bin().to_str().unwrap())
        .args(["features", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = |name: &str| {
        v["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    for name in ["rtt_cb_args", "iter_setsockopt"] {
        let c = c(name);
        assert_eq!(c["probed"], false, "{name} with lo down: {c}");
        assert_eq!(c["ok"], false, "{name}: {c}");
        assert!(
            c["detail"].as_str().unwrap().contains("is lo up?"),
            "{name}: {c}"
        );
    }
    // The probes that need no connection answer as on the host.
    for name in ["btf", "atomics", "ack_hook", "sk_storage_fexit"] {
        assert_eq!(c(name)["ok"], cap(&host, name), "{name}: {v}");
    }
    let rtt = v["views"]["tcp_rtt_source"].as_str().unwrap();
    let host_ack =
        cap(&host, "atomics") && cap(&host, "ack_hook") && cap(&host, "sk_storage_fexit");
    assert_eq!(rtt, if host_ack { "ack_hook" } else { "rtt_cb" }, "{v}");
    assert!(
        v["views"]["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().contains("not probed")),
        "{v}"
    );
    let text = ns
        .command(rttscope_bin().to_str().unwrap())
        .arg("features")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("rtt_cb_args") && l.contains(" ?  ")),
        "{text}"
    );
}

/// The report's plan for this kernel: each path as the capabilities decide it, checked against
/// the plan it prints; (RTT source, existing connections, sampler attach) returned.
fn paths_the_report_announces(f: &Value) -> (&'static str, &'static str, &'static str) {
    let plan = &f["views"];
    let atomics = cap(f, "atomics");
    // the atomics build's hook finds every flow in socket storage; the build without atomics'
    // hook times only connections open before attach, found by address
    let hook_all = atomics && cap(f, "ack_hook") && cap(f, "sk_storage_fexit");
    let rtt_path = match (cap(f, "rtt_cb_args"), hook_all) {
        (true, _) => "rtt_cb_args",
        (false, true) => "ack_hook",
        (false, false) => "srtt_fallback",
    };
    assert_eq!(plan["tcp_rtt_source"], rtt_path, "{f}");
    let existing = match (atomics, cap(f, "iter_setsockopt"), hook_all) {
        (false, _, _) if cap(f, "ack_hook") => "ack_hook_table",
        (false, _, _) => "none",
        (true, true, _) => "iterator",
        (true, false, true) => "ack_hook",
        (true, false, false) => "none",
    };
    assert_eq!(plan["tcp_existing_connections"], existing, "{f}");
    assert_eq!(
        plan["tcp_object"],
        if atomics { "tcp" } else { "tcp_noatomic" },
        "{f}"
    );
    // the sampler runs everywhere observe does (its build without atomics below 5.12)
    assert_eq!(plan["sampler_available"], true, "{f}");
    assert_eq!(
        plan["sampler_object"],
        if atomics {
            "sampler"
        } else {
            "sampler_noatomic"
        },
        "{f}"
    );
    let attach = if cap(f, "tcx") { "tcx" } else { "clsact" };
    assert_eq!(plan["sampler_attach"], attach, "{f}");

    (rtt_path, existing, attach)
}

/// observe's start record names the paths the report announced, and the connection opened
/// before the start is timed on both sides.
fn observe_took_them(
    lines: &[Value],
    loader: &str,
    (rtt_path, existing, attach): (&str, &str, &str),
    p: &Pair,
    cli: &RrClient,
    server: SocketAddr,
) {
    let tcp = &lines[0]["tcp"];
    let src = tcp["rtt_source"].as_str().unwrap();
    let want = match rtt_path {
        "rtt_cb_args" => "RTT_CB args",
        "ack_hook" => "fexit",
        _ => "srtt fallback",
    };
    assert!(src.starts_with(want), "{loader}: {want} announced, {tcp}");
    let ex = tcp["existing_path"].as_str().unwrap();
    let want = match existing {
        "iterator" => "iterator",
        "ack_hook" => "per-ACK hook",
        _ => "none",
    };
    assert!(ex.starts_with(want), "{loader}: {want} announced, {tcp}");
    assert_eq!(tcp["existing_not_timed"], 0, "{loader}: {tcp}");
    let how = &lines[0]["sampler"]["attached"][0]["how"];
    assert_eq!(how, attach, "{loader}: {}", lines[0]["sampler"]);
    // the connection opened before the start is timed on both sides
    for (ns, local) in [
        (&p.a.name, cli.local.to_string()),
        (&p.b.name, server.to_string()),
    ] {
        let row = end_flow(lines, ns, &local)
            .unwrap_or_else(|| panic!("{loader}: no flow {local} in {ns}: {lines:#?}"));
        let n = row["tcp"]["summary"]["n"].as_u64().unwrap_or(0);
        assert!(
            n > 0,
            "{loader}: existing connection not timed at {local}: {row}"
        );
    }
}

/// `features --iface NETNS:PATTERN`: every interface of the namespace that matches now, each with
/// its hooks (ingress and egress) and the pattern it matched; a pattern that matches nothing says
/// so in one line and is no error (observe would attach what appears later).
#[test]
fn an_interface_pattern_reports_each_match() {
    if !require_root() {
        return;
    }
    let p = Pair::new().unwrap();
    let run = |pattern: &str, json: bool| {
        let mut c = Command::new(rttscope_bin());
        c.args(["features", "--iface", pattern]);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{pattern}: {text}");
        text
    };
    let all = format!("{}:*", p.a.name);
    let doc: Value = serde_json::from_str(&run(&all, true)).unwrap();
    let mut seen: Vec<(String, usize)> = doc["ifaces"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|d| assert_eq!(d["pattern"], all.as_str(), "{d}"))
        .map(|d| {
            let name = d["iface"].as_str().unwrap().to_string();
            (name, d["hooks"].as_array().map_or(0, |h| h.len()))
        })
        .collect();
    seen.sort();
    let mut want = vec![
        (format!("{}:{}", p.a.name, p.a_if), 2),
        (format!("{}:lo", p.a.name), 2),
    ];
    want.sort();
    assert_eq!(seen, want, "{doc}");
    let none = format!("{}:zz*", p.a.name);
    let text = run(&none, false);
    assert!(
        text.contains(&format!("{none}: no interface matches now")),
        "{text}"
    );
}
