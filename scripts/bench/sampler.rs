//! Benchmark of the sampler view, run by scripts/bench-sampler.sh
//! (docs/perf-sampler.md): ns per packet of each tc program (BPF run-time
//! statistics, enabled through BPF_ENABLE_STATS for the run only; and
//! BPF_PROG_TEST_RUN on a crafted data segment and ACK) and the
//! transactions-per-second drop of a full-speed TCP request/response flow
//! between two namespaces with the sampler (`rttscope observe --view
//! sampler`) on both veth ends. Rounds alternate sampler off/on; medians are
//! compared.
//!
//! Environment: BENCH_ROUNDS (5), BENCH_SECS (3), BENCH_MATCH (seq),
//! BENCH_SAMPLE_EVERY (1); RTTSCOPE_BIN (default: the rttscope binary next
//! to this program's target directory).
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rttscope_e2e::frames::{frame, Tcp};
use rttscope_e2e::{rttscope_bin, ChildGuard, Pair, RrClient, RrServer, A_ADDR, B_ADDR};
use serde_json::Value;

/// A running `rttscope observe --view sampler --format json` and the
/// (name, id) of its programs, from its start line.
struct Sampler {
    child: ChildGuard,
    progs: Vec<(String, u64)>,
}

impl Sampler {
    fn start(args: &[&str]) -> Sampler {
        let mut cmd = std::process::Command::new(rttscope_bin());
        cmd.args(["observe", "--view", "sampler", "--format", "json"])
            .args(args);
        let mut child = ChildGuard::spawn(&mut cmd).expect("spawn rttscope observe");
        let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let Some(Ok(first)) = lines.next() else {
            let out = child.wait_output(Duration::from_secs(1));
            panic!("sampler did not start: {out:?}");
        };
        // keep reading: a closed pipe would end the sampler early
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        let start: Value = serde_json::from_str(&first).expect("start line is JSON");
        assert_eq!(start["type"], "start", "{first}");
        let progs = start["sampler"]["prog_ids"]
            .as_array()
            .expect("sampler.prog_ids")
            .iter()
            .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_u64().unwrap()))
            .collect();
        Sampler { child, progs }
    }
}

fn median(v: &mut [f64]) -> f64 {
    assert!(!v.is_empty(), "no values");
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn iface(ns: &rttscope_e2e::NetNs, name: &str) -> String {
    format!("{}:{}", ns.name, name)
}

/// BPF run-time statistics while the returned fd is open (BPF_ENABLE_STATS):
/// nothing global is left changed when the benchmark ends.
fn enable_bpf_stats() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr = [0u32; 4]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
                          // SAFETY: bpf(2) with a zeroed attr of the size we pass.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), 16usize) };
    // SAFETY: a fresh fd we own.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// ns per run of a loaded program on one frame, BPF_PROG_TEST_RUN with
/// `repeat` (time while preempted is excluded by the kernel).
fn test_run_ns(prog_id: u64, frame: &[u8], repeat: u32) -> Option<(f64, i32)> {
    #[repr(C)]
    #[derive(Default)]
    struct GetFd {
        prog_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    #[repr(C)]
    #[derive(Default)]
    struct TestRun {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    let g = GetFd {
        prog_id: prog_id as u32,
        ..Default::default()
    };
    // SAFETY: bpf(2) with attrs of the sizes we pass.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            &g as *const GetFd,
            std::mem::size_of::<GetFd>(),
        );
        if fd < 0 {
            return None;
        }
        let mut t = TestRun {
            prog_fd: fd as u32,
            data_size_in: frame.len() as u32,
            data_in: frame.as_ptr() as u64,
            repeat,
            ..Default::default()
        };
        let r = libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut t as *mut TestRun,
            std::mem::size_of::<TestRun>(),
        );
        libc::close(fd as i32);
        (r == 0).then_some((t.duration as f64, t.retval as i32))
    }
}

fn prog_stats(id: u64) -> (u64, u64) {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "prog", "show", "id", &id.to_string()])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        v["run_time_ns"].as_u64().unwrap_or(0),
        v["run_cnt"].as_u64().unwrap_or(0),
    )
}

fn rr_tps(pair: &Pair, server: SocketAddr, secs: f64) -> f64 {
    let c = RrClient::start(&pair.a, server, 1, Duration::ZERO).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // warm up
    let t0 = Instant::now();
    let n0 = c.transactions.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let n = c.transactions.load(Ordering::Relaxed) - n0;
    let tps = n as f64 / t0.elapsed().as_secs_f64();
    drop(c);
    tps
}

/// ns per packet of each tc program and the transaction-rate drop of a
/// full-speed TCP request/response flow with the sampler on both ends'
/// interfaces at --sample-every 1. Rounds alternate off/on to spread the
/// noise of a shared machine over both.
fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "bench_sampler: needs root (it creates network namespaces and loads BPF programs)"
        );
        std::process::exit(1);
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let matching = std::env::var("BENCH_MATCH").unwrap_or_else(|_| "seq".into());
    let every = std::env::var("BENCH_SAMPLE_EVERY").unwrap_or_else(|_| "1".into());
    let _stats = enable_bpf_stats().expect("BPF_ENABLE_STATS");
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5009").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut per_prog: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    let mut test_run: Vec<(String, f64)> = Vec::new();
    // per round: the regime of an idle 2-vCPU VM flips between ~15k and
    // ~50k TPS (CPUs idling between packets or not), and ns/packet with it:
    // compare rounds of similar TPS
    let mut per_round: Vec<serde_json::Value> = Vec::new();
    for round in 0..rounds {
        off.push(rr_tps(&pair, server, secs));
        let s = Sampler::start(&[
            "--iface",
            &iface(&pair.a, &pair.a_if),
            "--iface",
            &iface(&pair.b, &pair.b_if),
            "--match",
            &matching,
            "--sample-every",
            &every,
            "--duration",
            "600s",
            "--interval",
            "600s",
        ]);
        on.push(rr_tps(&pair, server, secs));
        let mut this_round: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for (name, id) in s.progs.clone() {
            let (ns, cnt) = prog_stats(id);
            let e = this_round.entry(name.clone()).or_default();
            e.0 += ns;
            e.1 += cnt;
            let e = per_prog.entry(name).or_default();
            e.0 += ns;
            e.1 += cnt;
        }
        // Program names before the redesign (rttscope_sm_egr/ing) too, so
        // that an older binary (RTTSCOPE_BIN) can be measured the same way.
        let nsp = |n: &str| {
            let old = n.replace("rtt_sampler_", "rttscope_sm_");
            this_round
                .get(n)
                .or_else(|| this_round.get(&old))
                .map(|(ns, c)| *ns as f64 / (*c).max(1) as f64)
                .unwrap_or(0.0)
        };
        println!(
            "  round {round}: TPS off {:.0} on {:.0}; egr {:.1} ns/packet, ing {:.1} ns/packet",
            off[round],
            on[round],
            nsp("rtt_sampler_egr"),
            nsp("rtt_sampler_ing")
        );
        per_round.push(
            serde_json::json!({"tps_off": off[round], "tps_on": on[round],
            "egr_ns": nsp("rtt_sampler_egr"), "ing_ns": nsp("rtt_sampler_ing")}),
        );
        if test_run.is_empty() {
            // one data segment out and its ACK in, run in a loop by the kernel
            let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
            let b_ip: [u8; 4] = B_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
            let data = frame(
                Tcp {
                    src: a_ip,
                    dst: b_ip,
                    sport: 40000,
                    dport: 5009,
                    seq: 1,
                    ack: 1,
                    flags: 0x18,
                    payload: 1,
                },
                0,
                false,
                5,
            );
            let ack = frame(
                Tcp {
                    src: b_ip,
                    dst: a_ip,
                    sport: 5009,
                    dport: 40000,
                    seq: 1,
                    ack: 2,
                    flags: 0x10,
                    payload: 0,
                },
                0,
                false,
                5,
            );
            for (name, id) in s.progs.clone().into_iter().take(2) {
                let f = if name.ends_with("egr") { &data } else { &ack };
                if let Some((ns, _)) = test_run_ns(id, f, 1_000_000) {
                    test_run.push((name, ns));
                }
            }
        }
        // SAFETY: end our own child (SIGTERM: it exits cleanly).
        unsafe { libc::kill(s.child.pid() as i32, libc::SIGTERM) };
        let _ = s.child.wait_output(Duration::from_secs(10));
    }
    let med = |v: &mut Vec<f64>| median(v);
    let (m_off, m_on) = (med(&mut off.clone()), med(&mut on.clone()));
    let drop_pct = (m_off - m_on) / m_off * 100.0;
    println!("sampler benchmark: match {matching}, {rounds} rounds x {secs} s, sampler on both veth ends, --sample-every {every}");
    println!("  TPS off: {off:.0?}  median {m_off:.0}");
    println!("  TPS on : {on:.0?}  median {m_on:.0}");
    println!("  TPS drop (medians): {drop_pct:.2} %");
    for (name, (ns, cnt)) in &per_prog {
        println!(
            "  {name}: {:.1} ns/packet over {cnt} runs",
            *ns as f64 / (*cnt).max(1) as f64
        );
    }
    for (name, ns) in &test_run {
        println!("  {name}: {ns:.1} ns/run in BPF_PROG_TEST_RUN (1e6 repeats; egress: a data segment, ingress: an ACK)");
    }
    println!(
        "{}",
        serde_json::json!({
            "test_run_ns": test_run.iter().map(|(n, ns)| serde_json::json!({"name": n, "ns_per_run": ns})).collect::<Vec<_>>(),
            "type": "bench_sampler", "match": matching, "sample_every": every, "rounds": rounds, "secs": secs,
            "tps_off": off, "tps_on": on, "drop_pct": drop_pct, "per_round": per_round,
            "progs": per_prog.iter().map(|(n, (ns, c))| serde_json::json!({"name": n, "run_time_ns": ns, "run_cnt": c, "ns_per_packet": *ns as f64 / (*c).max(1) as f64})).collect::<Vec<_>>(),
        })
    );
}
