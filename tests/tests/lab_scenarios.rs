//! Every lab scenario in its `--quick` form through the built binary: the
//! direction and rough size of each effect, and nothing left behind
//! (namespaces, state file, processes or threads in the testbed's
//! namespaces, the observer's kernel programs).
//!
//! The scenarios run one at a time (a lock): each measures timing on a
//! 2-CPU machine, and two at once would disturb each other.
//!
//! Each runs on a busy host (issue 27, `rttscope_e2e::busy`): request/response flows to the
//! lab's own port and pings, between other namespaces with the lab's client and server
//! addresses' neighbours, all started before the lab; and, inside the lab's own testbed, a
//! long-lived connection from its client namespace to its responder's port, opened as soon as
//! the responder accepts (before the observer starts). None of it may be in a row: each phase
//! takes its own connections by their 4-tuples and windows, and counts what it left out.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rttscope_e2e::{busy, require_root, rttscope_bin, threads_in, unique, HeldNs, Pair, RrServer};
use serde_json::Value;

/// Scenarios whose effects are milliseconds of configured delay, loss or queueing run two at a
/// time (the file's two test threads; 237 s one at a time in session 21's suite); the one that
/// measures sub-millisecond latency against idle CPUs (probe-interval) runs alone.
static SCENARIOS: RwLock<()> = RwLock::new(());

/// What a scenario run produced.
struct Run {
    out: PathBuf,
    result: Value,
    stdout: String,
}

impl Run {
    /// Summary of `view` at the phase labelled `label` (sweep point).
    fn point(&self, label: &str, view: &str) -> Value {
        let pts = self.result["sweep"]["points"]
            .as_array()
            .expect("sweep points");
        let p = pts
            .iter()
            .find(|p| p["settings"]["label"] == label)
            .unwrap_or_else(|| panic!("no point {label} in {}", self.table()));
        p["views"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["view"] == view)
            .cloned()
            .unwrap_or_else(|| panic!("no view {view} at {label}; table:\n{}", self.table()))
    }
    /// A statistic in ms (`p50`, `p95`, `p90` ...).
    fn ms(&self, label: &str, view: &str, stat: &str) -> f64 {
        let v = self.point(label, view);
        let x = if stat == "p90" {
            v["extra"]["p90_us"].as_f64()
        } else {
            v[format!("{stat}_us")].as_f64()
        };
        x.unwrap_or_else(|| panic!("{stat} of {view} at {label} missing: {v}")) / 1e3
    }
    /// The settings of the sweep point labelled `label`.
    fn point_settings(&self, label: &str) -> Value {
        self.result["sweep"]["points"]
            .as_array()
            .expect("sweep points")
            .iter()
            .find(|p| p["settings"]["label"] == label)
            .map(|p| p["settings"].clone())
            .unwrap_or_else(|| panic!("no point {label} in {}", self.table()))
    }
    fn table(&self) -> String {
        std::fs::read_to_string(self.out.join("SUMMARY.md")).unwrap_or_else(|_| self.stdout.clone())
    }
    /// Samples (seconds since the start, rtt ms) of a saved view series (`t_us`, `rtt_us`).
    fn series(&self, view: &str) -> Vec<(f64, f64)> {
        self.result["views"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == view)
            .unwrap_or_else(|| panic!("no series {view}"))["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["t_us"].as_f64().unwrap() / 1e6,
                    s["rtt_us"].as_f64().unwrap() / 1e3,
                )
            })
            .collect()
    }
    /// (samples, samples above `ms`) of a view's series in the phases with
    /// loss (every phase but the one labelled "0"), split by the phases'
    /// start times in `phases.json`.
    fn tail_share(&self, view: &str, ms: f64) -> (usize, usize) {
        let phases: Value = serde_json::from_str(
            &std::fs::read_to_string(self.out.join("phases.json")).expect("phases.json"),
        )
        .expect("phases.json parses");
        let starts: Vec<(String, f64)> = phases
            .as_array()
            .expect("phases")
            .iter()
            .map(|p| {
                (
                    p["phase"]["label"].as_str().unwrap_or_default().to_string(),
                    p["started_after_ms"].as_f64().expect("started_after_ms") / 1e3,
                )
            })
            .collect();
        let lossy = |t: f64| {
            starts
                .iter()
                .rev()
                .find(|(_, s)| *s <= t)
                .is_some_and(|(l, _)| l != "0")
        };
        let s: Vec<f64> = self
            .series(view)
            .into_iter()
            .filter(|&(t, _)| lossy(t))
            .map(|(_, v)| v)
            .collect();
        (s.len(), s.iter().filter(|&&v| v > ms).count())
    }
}

/// Threads in the testbed's namespaces (held open: rttscope_e2e::HeldNs), and processes whose
/// command line names the testbed.
fn processes_left(prefix: &str, held: &[HeldNs]) -> Vec<String> {
    let mut left = threads_in(held);
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return left;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(c) = std::fs::read(format!("/proc/{name}/cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(prefix) {
                left.push(format!("pid {name}: {c}"));
            }
        }
    }
    left
}

fn prog_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run `rttscope lab SCENARIO --quick --out <tmp>`, check it leaves nothing
/// behind, and return its result.
fn run(scenario: &str) -> Run {
    let (_beside, _alone) = if scenario == "probe-interval" {
        (
            None,
            Some(SCENARIOS.write().unwrap_or_else(|e| e.into_inner())),
        )
    } else {
        (
            Some(SCENARIOS.read().unwrap_or_else(|e| e.into_inner())),
            None,
        )
    };
    // The busy host's load, in other namespaces, on the lab's port (dropped at the end).
    let pair = Pair::new().unwrap();
    let port = rttscope::cmd::lab::env::PORT;
    let server = format!("{}:{port}", rttscope_e2e::B_ADDR).parse().unwrap();
    let _srv = RrServer::start(&pair.b, server, 1).unwrap();
    let busy = busy::BusyHost::start(&pair, server, busy::Responder::Plain { resp: 1 }).unwrap();
    eprintln!("{}", busy.describe());
    let out = std::env::temp_dir().join(unique(&format!("labsc-{scenario}")));
    let t0 = Instant::now();
    let mut child = Command::new(rttscope_bin())
        .args(["lab", scenario, "--quick", "--no-progress", "--out"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let prefix = format!("rtlab{}x0", child.id());
    let stdout_h = read_all(child.stdout.take().unwrap());
    let stderr_h = read_all(child.stderr.take().unwrap());
    let (status, held) = wait_holding_the_testbed(&mut child, &prefix, scenario, t0);
    let stdout = stdout_h.join().unwrap();
    let stderr = stderr_h.join().unwrap();
    let took = t0.elapsed();
    eprintln!("lab {scenario} --quick: {took:?}\n{stdout}");
    assert!(
        status.success(),
        "lab {scenario} failed ({status}): {stderr}\n{stdout}"
    );
    assert_eq!(held.len(), 3, "never saw the testbed {prefix}");
    nothing_left_behind(&prefix, held.into_values().collect());
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    observer_programs_unloaded(&result);
    // The files of the results directory.
    for f in [
        "result.json",
        "summary.csv",
        "SUMMARY.md",
        "plan.json",
        "phases.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing in {}", out.display());
    }
    let run = Run {
        out,
        result,
        stdout,
    };
    assert!(
        took < Duration::from_secs(90),
        "quick form took {took:?}\n{}",
        run.table()
    );
    run
}

/// All of a pipe, read on a thread of its own.
fn read_all(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        r.read_to_string(&mut s).ok();
        s
    })
}

/// Wait for the lab, holding its testbed's namespaces open while it runs (see HeldNs) and
/// keeping the load inside its client namespace; at most 150 s.
fn wait_holding_the_testbed(
    child: &mut std::process::Child,
    prefix: &str,
    scenario: &str,
    t0: Instant,
) -> (std::process::ExitStatus, BTreeMap<&'static str, HeldNs>) {
    let mut held = BTreeMap::new();
    let mut inside = InsideLoad::default();
    let status = loop {
        for r in ["cli", "rtr", "srv"] {
            if !held.contains_key(r) {
                if let Ok(h) = HeldNs::open(format!("/run/netns/{prefix}-{r}")) {
                    held.insert(r, h);
                }
            }
        }
        if held.contains_key("cli") {
            inside.keep_connected(&format!("{prefix}-cli"));
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(150) {
            let _ = child.kill();
            panic!("lab {scenario} --quick did not finish within 150 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("{}", inside.stop());
    (status, held)
}

/// No namespace, state file or process of the testbed left.
fn nothing_left_behind(prefix: &str, held: Vec<HeldNs>) {
    for r in ["cli", "rtr", "srv"] {
        assert!(
            !Path::new(&format!("/run/netns/{prefix}-{r}")).exists(),
            "namespace {prefix}-{r} left"
        );
    }
    assert!(
        !Path::new(&format!("/run/rttscope/lab/{prefix}.json")).exists(),
        "state file left"
    );
    // Processes the testbed killed may take a moment to be reaped: poll briefly.
    let deadline = Instant::now() + Duration::from_secs(3);
    let left = loop {
        let left = processes_left(prefix, &held);
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The observer's programs, by the ids its result recorded, are no longer loaded.
fn observer_programs_unloaded(result: &Value) {
    let start = &result["settings"]["passive"]["start"];
    let mut ids: Vec<u64> = start["tcp"]["prog_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_u64())
        .collect();
    ids.extend(
        start["sampler"]["prog_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v[1].as_u64()),
    );
    assert!(
        !ids.is_empty(),
        "observer's program ids not recorded: {start}"
    );
    let alive: Vec<u64> = ids.into_iter().filter(|&i| prog_exists(i)).collect();
    assert!(
        alive.is_empty(),
        "observer programs still loaded: {alive:?}"
    );
}

/// At each paced sweep point (one request/response session), on a busy host (issue 27): the
/// lab took exactly its own connection (`settings.flows`; none of the load's, although a
/// connection to the same port from the same namespace was open before the lab's observer
/// started), and every passive view holds exactly the point's own transactions (`rr`'s count):
/// - client side (TCP and sampler): one sample per transaction, tolerance 0 (the response
///   carries the ACK of the request);
/// - server side: the transactions or one fewer, a justified 1: the server times a response by
///   its ACK, which rides on the next request; the last response's ACK comes with the close,
///   after the window (it is inside when the client ACKs at once: above the delayed-ACK timer,
///   or after the timer fired);
/// - never more: the transaction in flight when `-l` ends is stopped and not counted, and the
///   window ends when its request left (once, at a load of 12, every view held n + 1 when the
///   window ended at the stop instead).
///
/// Measured (probe-interval, load on): 474 / 473 / 474 / 473 (tcp client, server, sampler
/// client, server) for 474 transactions at 10 ms, 80 of each for 80 at 100 ms, 15 for 15 at
/// 1 s; before the exact selection: +1 to +3 at every view (502 / 501 / 503 / 502 for 500).
/// What the phase left out is counted (`left_out`): with the load on, its connection's samples
/// (`other_connections`, thousands per point) and the own connection's handshake, hello and
/// close (`own_outside_window`, 10 to 12 per point). Back to back, TCP takes one RTT sample per
/// round-trip window, not per transaction: not compared.
fn own_counts(r: &Run, labels: &[&str]) {
    let t = r.table();
    let mut other = 0;
    for l in labels {
        let st = r.point_settings(l);
        let n = r.point(l, "rr")["count"].as_i64().unwrap();
        let count = |v: &str| r.point(l, v)["count"].as_i64().unwrap_or(-1);
        let counts = [
            ("tcp client", count("tcp client"), 0),
            ("sampler client", count("sampler client"), 0),
            ("tcp server", count("tcp server"), 1),
            ("sampler server", count("sampler server"), 1),
        ];
        // Samples the observer's ring buffers dropped while the point ran are counted, not
        // hidden: a point may lack that many (the lab waits for the buffers to accept every
        // sample again before a phase starts, so after the back-to-back point this is 0).
        let dropped = st["observer_dropped"].as_i64().unwrap();
        let seen = format!(
            "point {l}: {n} transactions; (view, samples, fewer allowed) {counts:?}; flows {}; left out {}; observer dropped {dropped}",
            st["flows"], st["left_out"]
        );
        eprintln!("{seen}");
        assert_eq!(st["flows"], 1, "{seen}\n{t}");
        for (v, c, fewer) in counts {
            assert!(
                c <= n && c >= n - fewer - dropped,
                "{v} has {c} samples for {n} transactions (want {n}{}): {seen}\n{t}",
                if fewer > 0 {
                    format!(" or {}", n - fewer)
                } else {
                    String::new()
                }
            );
        }
        other += st["left_out"]["other_connections"].as_u64().unwrap();
        assert!(
            st["left_out"]["own_outside_window"].as_u64().unwrap() > 0,
            "the handshake and close are left out and counted: {seen}"
        );
    }
    if busy::enabled() {
        assert!(
            other > 0,
            "the load's connection inside the testbed was seen and left out\n{t}"
        );
    }
    assert!(
        t.contains("were left out ("),
        "SUMMARY.md says what was left out:\n{t}"
    );
}

/// Load inside the lab's own testbed (busy host on): a `rttscope probe tcp-rr -w 10ms` from the
/// client namespace to the lab's responder, started again until it connects (the responder
/// starts after the namespaces), so that it is open before the lab's observer starts and runs
/// through every phase. The testbed kills it when the lab removes its namespaces.
#[derive(Default)]
struct InsideLoad {
    child: Option<std::process::Child>,
    started: Option<Instant>,
    tries: u32,
}

impl InsideLoad {
    fn keep_connected(&mut self, cli: &str) {
        if !busy::enabled() {
            return;
        }
        if let Some(c) = self.child.as_mut() {
            if c.try_wait().unwrap().is_none() {
                return; // running (connected, or connecting)
            }
            if self
                .started
                .is_some_and(|t| t.elapsed() > Duration::from_secs(2))
            {
                return; // it ran and the testbed ended it: do not start it again
            }
        }
        self.tries += 1;
        let port = rttscope::cmd::lab::env::PORT.to_string();
        let srv = rttscope::lab::testbed::SRV_ADDR.to_string();
        let bin = rttscope_bin();
        self.child = Command::new("ip")
            .args(["netns", "exec", cli])
            .arg(&bin)
            .args([
                "probe", "tcp-rr", &srv, "-p", &port, "-l", "600", "-w", "10ms", "-W", "600",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        self.started = Some(Instant::now());
    }

    /// Stop it; what ran, for the failure messages.
    fn stop(mut self) -> String {
        if !busy::enabled() {
            return "no load inside the testbed (busy-host load off)".into();
        }
        let ran = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        format!(
            "inside the testbed: probe tcp-rr -w 10ms to the lab's port ({} start(s), the last one ran {ran:.1} s)",
            self.tries
        )
    }
}

impl Drop for InsideLoad {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn cleanup(r: Run) {
    let _ = std::fs::remove_dir_all(&r.out);
}

#[test]
fn delayed_ack_server_tcp_rtt_follows_the_interval() {
    if !require_root() {
        return;
    }
    let r = run("delayed-ack");
    let t = r.table();
    own_counts(&r, &["1", "2", "4", "8", "16", "32", "39", "40", "41"]);
    let srv16 = r.ms("16", "tcp server", "p50");
    let cli16 = r.ms("16", "tcp client", "p50");
    assert!(
        (10.0..=30.0).contains(&srv16),
        "server TCP p50 at 16 ms: {srv16}\n{t}"
    );
    assert!(cli16 < 2.0, "client TCP p50 at 16 ms: {cli16}\n{t}");
    // RR latency stays small at every interval; server TCP grows.
    for l in ["0", "1", "2", "4", "8", "16", "32", "39", "40", "41"] {
        let rr = r.ms(l, "rr", "p50");
        assert!(rr < 3.0, "RR p50 at {l} ms: {rr}\n{t}");
        let c = r.ms(l, "tcp client", "p50");
        assert!(c < 2.0, "client TCP p50 at {l} ms: {c}\n{t}");
    }
    let s0 = r.ms("0", "tcp server", "p50");
    let s8 = r.ms("8", "tcp server", "p50");
    let s32 = r.ms("32", "tcp server", "p50");
    assert!(s0 < 2.0, "server TCP p50 back to back: {s0}\n{t}");
    assert!(
        (5.0..=12.0).contains(&s8),
        "server TCP p50 at 8 ms: {s8}\n{t}"
    );
    assert!(
        (25.0..=40.0).contains(&s32),
        "server TCP p50 at 32 ms: {s32}\n{t}"
    );
    // Past ~40 ms the client's delayed-ACK timer fires before the next
    // request: either the timer's ACK (~40 ms) or, once that took the socket
    // out of ping-pong mode, immediate ACKs (both seen at 41 ms here). Never
    // the interval beyond the timer.
    for l in ["39", "40", "41"] {
        let x = r.ms(l, "tcp server", "p50");
        assert!(
            x <= 45.0,
            "server TCP p50 at {l} ms: {x} (delayed-ACK timer ~40 ms)\n{t}"
        );
    }
    // The sampler on the server's interface sees the same as the server's TCP.
    let m16 = r.ms("16", "sampler server", "p50");
    assert!(
        (m16 - srv16).abs() < 3.0,
        "sampler server {m16} vs TCP {srv16}\n{t}"
    );
    assert!(r.point("16", "sampler server")["extra"]["cloud_p50_us"]
        .as_f64()
        .is_some());
    assert!(r.out.join("sweep.png").is_file() && r.out.join("sweep.svg").is_file());
    assert!(
        r.stdout.contains("sweep.png"),
        "chart path printed: {}",
        r.stdout
    );
    cleanup(r);
}

#[test]
fn beyond_ack_timer_sampler_sees_the_think_time_tcp_does_not() {
    if !require_root() {
        return;
    }
    let r = run("beyond-ack-timer");
    let t = r.table();
    for l in ["100", "300", "1000"] {
        for v in ["tcp client", "tcp server"] {
            let x = r.ms(l, v, "p50");
            assert!(
                (9.0..=20.0).contains(&x),
                "{v} p50 at {l} ms: {x} (path 10 ms)\n{t}"
            );
        }
    }
    // At 1 s, a good part of the server-side sampler's samples (1 in 4
    // packets) pair a response with the next request: near the interval.
    // Odds of a false failure: a transaction gives such a sample when its
    // response is sampled (1/4), the client's delayed ACK of it is not (3/4)
    // and one of the next request's two segments is (7/16): 21/256. The quick
    // phase makes ~390 transactions at 1 s (30 sessions, 14 s, the first
    // second connecting): `near` is ~Binomial(390, 0.082), mean ~32 (a 10 s
    // phase gave 19 in a run of 2026-12-07, i.e. ~27 expected at 14 s). Even
    // at a mean of 20, P(near < 3) = 4.5e-7. (With 10 sessions for 8 s the
    // mean was ~6.6, P ~ 4%, and the test failed now and then.)
    let smp: Vec<(f64, f64)> = r.series("sampler server");
    let near = smp
        .iter()
        .filter(|s| (800.0..=1300.0).contains(&s.1))
        .count();
    eprintln!(
        "sampler server at 1000 ms: {near} of {} samples near 1000 ms",
        smp.len()
    );
    assert!(
        near >= 3,
        "sampler samples near 1000 ms: {near} of {}\n{t}",
        smp.len()
    );
    let p95 = r.ms("1000", "sampler server", "p95");
    assert!(p95 > 500.0, "server sampler p95 at 1000 ms: {p95}\n{t}");
    cleanup(r);
}

#[test]
fn rtt_step_every_view_follows_the_added_50ms() {
    if !require_root() {
        return;
    }
    let r = run("rtt-step");
    let t = r.table();
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(r.out.join("plan.json")).unwrap()).unwrap();
    let steps: Vec<f64> = plan["phases"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["at_ms"].as_f64().unwrap() / 1e3)
        .collect();
    let half = steps[0];
    // t_s of the series counts from the phase's start (one phase).
    let mut medians = Vec::new();
    for v in ["rr", "ping", "tcp-connect", "tcp client", "sampler client"] {
        let s = r.series(v);
        let med = |high: bool| {
            let mut x: Vec<f64> = s
                .iter()
                .filter(|(ts, _)| {
                    let k = (ts / half).floor() as i64;
                    let into = ts - k as f64 * half;
                    into > 1.0 && ((k % 2 == 1) == high)
                })
                .map(|s| s.1)
                .collect();
            x.sort_by(|a, b| a.total_cmp(b));
            assert!(
                x.len() >= 5,
                "{v}: {} samples in the {} halves\n{t}",
                x.len(),
                if high { "high" } else { "low" }
            );
            x[x.len() / 2]
        };
        let (lo, hi) = (med(false), med(true));
        assert!(
            (95.0..=110.0).contains(&lo),
            "{v} low median {lo} (100 ms path)\n{t}"
        );
        assert!(
            (40.0..=60.0).contains(&(hi - lo)),
            "{v}: high {hi} - low {lo} should be ~50 ms\n{t}"
        );
        medians.push((v, lo, hi));
    }
    // The handshake (the kernel's SYN to SYN-ACK) measures the path as ping does, where ICMP
    // would be denied (issue 45 item 4): within 5% of ping's median in both halves.
    let of = |v: &str| medians.iter().find(|m| m.0 == v).copied().unwrap();
    let (ping, conn) = (of("ping"), of("tcp-connect"));
    for (what, p, c) in [("low", ping.1, conn.1), ("high", ping.2, conn.2)] {
        assert!(
            (c - p).abs() <= 0.05 * p,
            "tcp-connect {what} median {c} vs ping {p}: more than 5% apart\n{t}"
        );
    }
    assert!(r.out.join("timeseries.png").is_file());
    cleanup(r);
}

#[test]
fn loss_inflates_the_application_tail_more_than_tcp_rtt() {
    if !require_root() {
        return;
    }
    let r = run("loss");
    let t = r.table();
    let rr0 = r.ms("0", "rr", "p95");
    assert!(rr0 < 130.0, "RR p95 without loss: {rr0}\n{t}");
    let rr10 = r.ms("10", "rr", "p95");
    assert!(
        rr10 > 250.0,
        "RR p95 at 10% loss: {rr10} (RTO >= 200 ms + RTT)\n{t}"
    );
    // TCP's own tail rises too, less often: Karn's rule keeps retransmitted
    // segments out, but with timestamps an ACK that echoes the original
    // transmission's TSval (the response was lost and the server resent it)
    // yields a sample that includes the RTO. So compare how often each view
    // lands beyond an RTO, pooled over the lossy phases (one phase's p95 of
    // either can land in its tail: in CI, RR 495 vs TCP 411 ms at 10 %).
    let (rr_n, rr_tail) = r.tail_share("rr", 250.0);
    let (tcp_n, tcp_tail) = r.tail_share("tcp client", 250.0);
    let (smp_n, smp_tail) = r.tail_share("sampler client", 250.0);
    let share = |n: usize, k: usize| k as f64 / n.max(1) as f64;
    let shares = format!(
        "> 250 ms with loss: RR {rr_tail}/{rr_n}, TCP client {tcp_tail}/{tcp_n}, \
         sampler client {smp_tail}/{smp_n}"
    );
    assert!(
        rr_n >= 150 && tcp_n >= 150 && smp_n >= 150,
        "too few samples in the lossy phases: {shares}\n{t}"
    );
    assert!(
        share(rr_n, rr_tail) > share(tcp_n, tcp_tail),
        "transactions beyond an RTO should be more frequent than TCP's samples there: {shares}\n{t}"
    );
    assert!(
        share(smp_n, smp_tail) > share(tcp_n, tcp_tail),
        "the sampler (no Karn) should land beyond an RTO more often than TCP: {shares}\n{t}"
    );
    eprintln!("{shares}");
    for level in ["10", "20"] {
        let p50 = r.ms(level, "tcp client", "p50");
        assert!(
            (95.0..=130.0).contains(&p50),
            "TCP client p50 at {level}% loss: {p50}\n{t}"
        );
    }
    assert!(r.out.join("sweep.png").is_file());
    cleanup(r);
}

#[test]
fn bufferbloat_every_view_rises_with_the_deep_queue() {
    if !require_root() {
        return;
    }
    let r = run("bufferbloat");
    let t = r.table();
    for v in ["rr", "ping", "tcp-connect", "tcp client", "sampler client"] {
        let idle = r.ms("idle", v, "p50");
        let deep = r.ms("deep 1MiB", v, "p50");
        assert!(idle < 25.0, "{v} idle p50 {idle} (10 ms path)\n{t}");
        assert!(
            deep > idle + 100.0,
            "{v}: deep-queue p50 {deep} vs idle {idle}\n{t}"
        );
    }
    // The bulk flow ran near the bottleneck's rate.
    let pts = r.result["sweep"]["points"].as_array().unwrap();
    let deep = pts
        .iter()
        .find(|p| p["settings"]["label"] == "deep 1MiB")
        .unwrap();
    let bps = deep["settings"]["bulk"]["received_bps"].as_f64();
    assert!(
        bps.is_some_and(|b| (5e6..=10.5e6).contains(&b)),
        "bulk goodput {bps:?} through 10 Mbit/s\n{t}"
    );
    cleanup(r);
}

#[test]
fn probe_interval_sparse_probes_see_more_latency() {
    if !require_root() {
        return;
    }
    let r = run("probe-interval");
    let t = r.table();
    own_counts(&r, &["10", "100", "1000"]);
    // Undelayed path: back-to-back request/response keeps both ends busy
    // and their caches warm; probes 10 ms to 1 s apart find them idle. How much
    // slower depends on how idle the host is: 2 to 4 times on a quiet one, but
    // 1.4 to 2 times in CI with the busy-host load and the suite's background
    // builds (back-to-back 0.141 ms; 10, 100, 1000 ms: 0.220, 0.281, 0.204 ms),
    // so each sparse interval is only asserted not faster than back to back,
    // and the sparsest-looking one clearly slower.
    let b2b = r.ms("back-to-back", "rr", "p50");
    assert!(b2b < 0.5, "back-to-back RR p50 {b2b}\n{t}");
    let sparse: Vec<f64> = ["10", "100", "1000"]
        .iter()
        .map(|l| r.ms(l, "rr", "p50"))
        .collect();
    for (l, x) in ["10", "100", "1000"].iter().zip(&sparse) {
        assert!(*x > b2b, "RR p50 at {l} ms {x} vs back-to-back {b2b}\n{t}");
    }
    let worst = sparse.iter().cloned().fold(0.0, f64::max);
    assert!(
        worst > 1.3 * b2b,
        "RR p50 at the sparse intervals {sparse:?} vs back-to-back {b2b}\n{t}"
    );
    let pb = r.ms("back-to-back", "ping", "p50");
    let ps = r.ms("1000", "ping", "p50");
    assert!(ps > pb, "ping p50 at 1 s {ps} vs back-to-back {pb}\n{t}");
    let n = r.point("1000", "rr")["count"].as_u64().unwrap();
    assert!(
        (10..=16).contains(&n),
        "RR samples at 1 s over 15 s: {n}\n{t}"
    );
    // At a 10 ms interval the server's TCP RTT is the interval (delayed ACK).
    let s10 = r.ms("10", "tcp server", "p50");
    assert!(
        (7.0..=13.0).contains(&s10),
        "server TCP p50 at 10 ms: {s10}\n{t}"
    );
    cleanup(r);
}
