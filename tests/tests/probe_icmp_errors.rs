//! `rttscope probe icmp` reports ICMP errors and the replies' TTL as ping does (issue 27,
//! item 8): through the lab's router (client, router, server namespaces the test creates), with
//! ping itself run on the same path as the truth for every line.
//!
//! - TTL 1 (`-t 1`): the router answers "Time to live exceeded" (IPv6: "Time exceeded: Hop
//!   limit") for each request.
//! - A route of type `unreachable` on the router: "Destination Host Unreachable" (IPv6:
//!   "Destination unreachable: No route").
//! - Replies through the router: `ttl=` one below the server's, as ping's.
//!
//! Each error is counted (`errors` in the result, `+N errors` in ping's summary line) and its
//! request lost. The router's ICMP rate limits are off for the test (its own namespace).
use std::process::Output;

use rttscope::lab::testbed::{Role, Testbed, RTR_CLI_ADDR, RTR_CLI_ADDR6, SRV_ADDR, SRV_ADDR6};
use rttscope_e2e::{require_root, rttscope_bin};
use serde_json::Value;

/// An address behind the router's `unreachable` routes.
const UNREACHABLE: &str = "10.79.3.5";
const UNREACHABLE6: &str = "fd79:3::5";

fn testbed() -> Testbed {
    let tb = Testbed::new().unwrap();
    for args in [
        &["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"][..],
        &["sysctl", "-qw", "net.ipv6.icmp.ratelimit=0"],
        &["ip", "route", "add", "unreachable", "10.79.3.0/24"],
        &["ip", "-6", "route", "add", "unreachable", "fd79:3::/64"],
    ] {
        let out = tb.exec(Role::Rtr, args).unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    tb
}

/// ping's options for both tools: 3 echoes `interval` apart, numeric; `extra` appended.
fn run(tb: &Testbed, tool: &str, dst: &str, interval: &str, extra: &[&str]) -> Output {
    let bin = rttscope_bin();
    let mut cmd = if tool == "ping" {
        tb.command(Role::Cli, "ping")
    } else {
        let mut c = tb.command(Role::Cli, &bin.to_string_lossy());
        c.args(["probe", "icmp"]);
        c
    };
    cmd.args(["-n", "-c", "3", "-i", interval, "-W", "1", dst])
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The lines that are neither ping's header nor its summary: one per reply or error.
fn packet_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("From ") || l.contains(" bytes from "))
        .map(str::to_string)
        .collect()
}

/// A reply line without its time (`time=` differs between runs).
fn without_time(l: &str) -> String {
    l.split(" time=").next().unwrap_or(l).to_string()
}

/// A reply line's header without the `PING` target wording, which differs (ping names the
/// address twice): from `bytes from`.
fn from_bytes(l: &str) -> String {
    without_time(l)
        .split_once(" bytes from ")
        .map(|(_, r)| r.to_string())
        .unwrap_or_default()
}

/// The error lines, which must be ping's to the letter, and the result's counts, with both
/// kinds of ICMP socket: raw (root, errors arrive as packets) and datagram (the client
/// namespace's `ping_group_range` opened to root's group: errors from the socket's error queue,
/// IP_RECVERR, as an unprivileged user gets them).
fn check_errors(tb: &Testbed, dst: &str, extra: &[&str], want: &str) {
    // The router answers an IPv4 `unreachable` route at most once a second (ip_error's own
    // limit, net.ipv4.route.error_cost: global, left alone); the others 0.3 s apart.
    let interval = if dst == UNREACHABLE { "1.1" } else { "0.3" };
    let pause = || {
        if dst == UNREACHABLE {
            // ... also between one tool's last error and the next one's first.
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
    };
    let ping = run(tb, "ping", dst, interval, extra);
    let pl = packet_lines(&ping);
    eprintln!("{dst} {extra:?}: ping {pl:?}");
    assert_eq!(pl.len(), 3, "ping's lines: {ping:?}");
    assert!(pl.iter().all(|l| l.ends_with(want)), "ping said: {pl:?}");
    assert!(!ping.status.success());
    for socket in ["raw", "dgram"] {
        let range = if socket == "dgram" { "0 0" } else { "1 0" };
        let set = format!("net.ipv4.ping_group_range={range}");
        assert!(tb
            .exec(Role::Cli, &["sysctl", "-qw", &set])
            .unwrap()
            .status
            .success());
        pause();
        let json = std::env::temp_dir().join(rttscope_e2e::unique("icmperr"));
        let mut args = extra.to_vec();
        let j = json.to_string_lossy().to_string();
        args.extend(["--json", &j]);
        let probe = run(tb, "probe", dst, interval, &args);
        let text = String::from_utf8_lossy(&probe.stdout);
        eprintln!("probe ({socket} socket):\n{text}");
        assert_eq!(
            packet_lines(&probe),
            pl,
            "probe icmp's error lines are ping's"
        );
        assert!(
            text.contains("3 packets transmitted, 0 received, +3 errors, 100% packet loss"),
            "{text}"
        );
        // No reply at all: a non-zero exit, as ping's.
        assert!(!probe.status.success());
        let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        assert_eq!(doc["settings"]["icmp_socket"], socket, "{doc}");
        let counts = &doc["views"][0]["details"]["counts"];
        assert_eq!(counts["errors"], 3, "{doc}");
        assert_eq!(counts["lost"], 3, "{doc}");
        assert_eq!(counts["received"], 0, "{doc}");
        if !extra.is_empty() {
            assert_eq!(
                doc["settings"]["ttl"], 1,
                "the TTL asked for is recorded: {doc}"
            );
        }
    }
    let reset = "net.ipv4.ping_group_range=1 0";
    assert!(tb
        .exec(Role::Cli, &["sysctl", "-qw", reset])
        .unwrap()
        .status
        .success());
}

#[test]
fn icmp_errors_are_printed_and_counted_as_ping_does() {
    if !require_root() {
        return;
    }
    let tb = testbed();
    let (srv, srv6) = (SRV_ADDR.to_string(), SRV_ADDR6.to_string());
    check_errors(&tb, &srv, &["-t", "1"], "Time to live exceeded");
    check_errors(&tb, &srv6, &["-t", "1"], "Time exceeded: Hop limit");
    check_errors(&tb, UNREACHABLE, &[], "Destination Host Unreachable");
    check_errors(&tb, UNREACHABLE6, &[], "Destination unreachable: No route");
    // The errors came from the router.
    let out = run(&tb, "probe", &srv, "0.3", &["-t", "1"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("From {RTR_CLI_ADDR} icmp_seq=1 ")),
        "{out:?}"
    );
    let out = run(&tb, "probe", UNREACHABLE6, "0.3", &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("From {RTR_CLI_ADDR6} icmp_seq=1 ")),
        "{out:?}"
    );
}

#[test]
fn replies_carry_ttl_as_ping_prints_it() {
    if !require_root() {
        return;
    }
    let tb = testbed();
    for (dst, range) in [SRV_ADDR.to_string(), SRV_ADDR6.to_string()]
        .into_iter()
        .flat_map(|d| [(d.clone(), "1 0"), (d, "0 0")])
    {
        // raw, then datagram socket (see check_errors)
        let set = format!("net.ipv4.ping_group_range={range}");
        assert!(tb
            .exec(Role::Cli, &["sysctl", "-qw", &set])
            .unwrap()
            .status
            .success());
        let ping = run(&tb, "ping", &dst, "0.3", &[]);
        let probe = run(&tb, "probe", &dst, "0.3", &[]);
        assert!(
            String::from_utf8_lossy(&probe.stdout).contains(if range == "0 0" {
                "dgram socket"
            } else {
                "raw socket"
            }),
            "{probe:?}"
        );
        let (pl, rl) = (packet_lines(&ping), packet_lines(&probe));
        eprintln!("{dst} (ping_group_range {range}): ping {pl:?}\nprobe {rl:?}");
        assert!(probe.status.success(), "{probe:?}");
        assert_eq!(rl.len(), 3, "{probe:?}");
        // One hop: the server's 64 less the router's.
        assert!(rl.iter().all(|l| l.contains(" ttl=63 ")), "{rl:?}");
        let strip = |v: &[String]| v.iter().map(|l| from_bytes(l)).collect::<Vec<_>>();
        assert_eq!(
            strip(&rl),
            strip(&pl),
            "the reply lines are ping's, but for the time"
        );
        let text = String::from_utf8_lossy(&probe.stdout);
        assert!(
            text.contains("3 packets transmitted, 3 received, 0% packet loss"),
            "no errors, no `errors` in the summary: {text}"
        );
    }
}
