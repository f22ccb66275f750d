//! The command line as a user meets it, through the real binary, no
//! privileges: the duration grammar's refusals (one sentence, exit status 2),
//! ping's flags, `--version`, and the progress line - drawn on a terminal
//! (a pty from `script`), absent from a pipe and with `--quiet`.
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use rttscope_e2e::{rttscope_bin, ChildGuard};

fn run(args: &[&str]) -> Output {
    Command::new(rttscope_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running rttscope")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A lone `m` anywhere but netperf's -w, and a bare number where no tool
/// defines one, are refused by the binary with the sentence and exit 2.
#[test]
fn duration_refusals_are_one_sentence() {
    for (args, want) in [
        (
            &["probe", "tcp-rr", "h", "-l", "2m"][..],
            "'2m' is ambiguous: write 2ms for milliseconds or 2min for minutes",
        ),
        (
            &["probe", "icmp", "h", "-i", "5m"],
            "'5m' is ambiguous: write 5ms for milliseconds or 5min for minutes",
        ),
        (
            &["observe", "--interval", "10"],
            "'10' has no unit: write 10s for seconds, 10ms for milliseconds",
        ),
        (
            &["probe", "irtt", "h", "-d", "1m"],
            "'1m' is ambiguous: write 1ms for milliseconds or 1min for minutes",
        ),
        (&["compare", "h", "-l", "soon"], "'soon' is not a duration"),
    ] {
        let o = run(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

/// ping's flags are taken, and what ping does not have is refused.
#[test]
fn ping_flags_through_the_binary() {
    // -c 1 to the loopback: one reply line, ping's statistics, exit 0.
    let o = run(&[
        "probe",
        "icmp",
        "127.0.0.1",
        "-c",
        "1",
        "-i",
        "0.2",
        "-W",
        "1",
        "-s",
        "16",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    if o.status.success() {
        assert!(
            out.contains("PING 127.0.0.1 16(44) bytes of data."),
            "{out}"
        );
        assert!(
            out.contains("24 bytes from 127.0.0.1: icmp_seq=1 ttl=64 time="),
            "{out}"
        );
    } else {
        // Unprivileged without ping sockets (net.ipv4.ping_group_range): one sentence.
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
    for bad in [
        &["probe", "icmp", "h", "--nodelay"][..],
        &["probe", "icmp", "h", "-p", "1"],
        &["probe", "icmp", "h", "-l", "1"],
    ] {
        assert_eq!(run(bad).status.code(), Some(2), "{bad:?} must be refused");
    }
}

#[test]
fn version_names_commit_and_loaders() {
    let o = run(&["--version"]);
    let v = String::from_utf8_lossy(&o.stdout);
    assert!(v.starts_with("rttscope "), "{v}");
    assert!(v.contains("(commit ") && v.contains("loaders: "), "{v}");
    let commit = v
        .split("(commit ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or("");
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "commit '{commit}' in {v}"
    );
}

/// A free loopback port (TCP and UDP both unused, very likely).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `rttscope serve` on the loopback for the probe tests.
fn serve() -> (ChildGuard, u16) {
    let port = free_port();
    let g = ChildGuard::spawn(
        Command::new(rttscope_bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    for _ in 0..50 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (g, port);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("rttscope serve did not listen on {port}");
}

/// Run `rttscope ARGS` on a pseudo-terminal (`script -qec`): what the
/// terminal received, stdout and stderr together.
fn on_a_terminal(args: &[&str]) -> String {
    let cmd = std::iter::once(rttscope_bin().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux) runs");
    assert!(o.status.success(), "{cmd}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A 2.5 s TCP_RR run on a terminal shows the live line (redrawn in place,
/// counting transactions) and erases it before the results; the same run
/// into a pipe, or with --quiet, writes not one byte of it.
#[test]
fn progress_line_on_a_terminal_only() {
    let (_serve, port) = serve();
    let p = port.to_string();
    let args = [
        "probe",
        "tcp-rr",
        "127.0.0.1",
        "-p",
        &p,
        "-l",
        "2.5",
        "-w",
        "10",
    ];
    let tty = on_a_terminal(&args);
    let draws = tty.matches("\r\x1b[2Kprobe TCP_RR 127.0.0.1: ").count();
    assert!(
        draws >= 4,
        "expected a line redrawn every 250 ms after 1 s, saw {draws}: {tty:?}"
    );
    assert!(tty.contains(" / 2.5s, "), "{tty:?}");
    assert!(tty.contains(" transactions, last "), "{tty:?}");
    assert!(
        tty.contains("\r\x1b[2KTCP_RR to 127.0.0.1"),
        "erased before the results: {tty:?}"
    );

    let mut quiet = args.to_vec();
    quiet.push("--quiet");
    let tty_quiet = on_a_terminal(&quiet);
    assert!(!tty_quiet.contains('\x1b'), "--quiet: {tty_quiet:?}");
    assert!(tty_quiet.contains("TCP_RR to 127.0.0.1"), "{tty_quiet:?}");

    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "not a terminal: nothing on stderr");
    assert!(!String::from_utf8_lossy(&o.stdout).contains('\x1b'));
}

/// `observe --quiet` prints only what was asked (nothing, without --listen):
/// no header, no attach lines, no closing line; without it, the header and
/// the closing line are there (so the test can tell).
#[test]
fn observe_quiet_prints_only_what_was_asked() {
    if !rttscope_e2e::require_root() {
        return;
    }
    let port = free_port().to_string();
    let base = ["observe", "--duration", "1500ms", "--port", &port];
    let loud = run(&base);
    let out = String::from_utf8_lossy(&loud.stdout);
    assert!(loud.status.success(), "{}", stderr(&loud));
    assert!(out.starts_with("rttscope observe"), "{out}");
    assert!(out.contains("done after"), "{out}");
    let mut q = base.to_vec();
    q.push("--quiet");
    let quiet = run(&q);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(String::from_utf8_lossy(&quiet.stdout), "", "--quiet stdout");
    assert_eq!(
        stderr(&quiet),
        "",
        "--quiet stderr (not a terminal: no progress)"
    );
}

/// `probe irtt` prints irtt's line per packet (`seq=N rtt=... rd=... sd=...
/// ipdv=...`) as replies arrive, one per answered seqno in order on the
/// loopback, before the summary; `-q` prints none. Against the real `irtt
/// server` (scripts/setup.sh installs it).
#[test]
fn irtt_line_per_packet_unless_quiet() {
    if Command::new("irtt").arg("version").output().is_err() {
        eprintln!("skipping: irtt is not installed (scripts/setup.sh)");
        return;
    }
    let port = free_port();
    let _server = ChildGuard::spawn(
        Command::new("irtt")
            .args(["server", "-b", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let server = format!("127.0.0.1:{port}");
    let o = run(&["probe", "irtt", &server, "-i", "50ms", "-d", "500ms"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}\n{out}", stderr(&o));
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("seq=")).collect();
    // 500 ms at 50 ms: 10 packets (irtt may drop the last send at the edge).
    assert!((9..=11).contains(&lines.len()), "{out}");
    for (i, l) in lines.iter().enumerate() {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f[0], format!("seq={i}"), "{out}");
        assert!(f[1].starts_with("rtt=") && f[1].ends_with('s'), "{l}");
        assert!(f[2].starts_with("rd=") && f[3].starts_with("sd="), "{l}");
        assert_eq!(f[4].starts_with("ipdv=n/a"), i == 0, "{l}");
    }
    let first_summary = out.find("irtt probe").expect("the summary");
    assert!(
        out.find("seq=").unwrap() < first_summary,
        "lines come first: {out}"
    );
    let q = run(&["probe", "irtt", &server, "-i", "50ms", "-d", "200ms", "-q"]);
    assert!(q.status.success(), "{}", stderr(&q));
    assert!(!String::from_utf8_lossy(&q.stdout).contains("seq="));
}

/// A warning logged into a pipe carries no ANSI colour codes (a log file or
/// the journal would show `^[[33m`); on a terminal it is coloured. The
/// warning: a UDP_RR responder that never answers the cookie request.
#[test]
fn logs_are_coloured_only_on_a_terminal() {
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port().to_string();
    let args = [
        "probe",
        "udp-rr",
        "127.0.0.1",
        "-p",
        &port,
        "-n",
        "1",
        "-W",
        "0.2",
        "-r",
        "1,64",
    ];
    let o = run(&args);
    let e = stderr(&o);
    assert!(e.contains(" WARN ") && e.contains("no UDP cookie"), "{e}");
    assert!(!e.contains('\x1b'), "escape codes in a pipe: {e:?}");
    let cmd = std::iter::once(rttscope_bin().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let tty = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .output()
        .expect("script runs");
    let t = String::from_utf8_lossy(&tty.stdout);
    assert!(t.contains("\x1b[33m WARN"), "coloured on a terminal: {t:?}");
}

/// `compare` refuses -b 0 and -l 0 with the same sentence as `probe tcp-rr`
/// (before needing any privilege or a responder).
#[test]
fn compare_and_probe_refuse_the_same_netperf_values() {
    for (flag, value, want) in [
        ("-b", "0", "-b BURST must be at least 1"),
        ("-l", "0", "-l DURATION must be above zero"),
    ] {
        for cmd in [
            &["compare", "127.0.0.1"][..],
            &["probe", "tcp-rr", "127.0.0.1"],
        ] {
            let mut args = cmd.to_vec();
            args.extend([flag, value]);
            let o = run(&args);
            assert_eq!(o.status.code(), Some(1), "{args:?}");
            assert_eq!(stderr(&o).trim(), format!("rttscope: {want}"), "{args:?}");
        }
    }
}
