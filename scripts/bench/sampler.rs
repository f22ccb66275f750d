//! Benchmark of the sampler view against ePPing, run by
//! scripts/bench-sampler.sh (docs/perf-sampler.md): ns per run of each tc
//! program (BPF run-time statistics, enabled through BPF_ENABLE_STATS for
//! the run only) on a full-speed TCP request/response flow between two
//! namespaces, then on an ICMP echo flood (ping -f).
//!
//! In each round, and for each ePPing option set, one tc (tcx) chain on both
//! veth ends holds at once a do-nothing program (the floor), the sampler of
//! the previous rttscope (BENCH_BEFORE_BIN), this one (`rttscope observe
//! --view sampler`) and ePPing (BENCH_EPPING_BIN, see epping.rs), attached
//! in that order in even rounds and in the reverse order in odd rounds:
//! every program sees the same packets, and each takes the cold first place
//! as often as the others. Printed per round and as medians with their
//! spread: the floor, each program's ns per run and the above-floor ratio
//! (ours - floor) / (ePPing - floor), per direction, for TCP and ICMP.
//!
//! Environment: BENCH_ROUNDS (9), BENCH_SECS (3: TCP; ICMP half of it),
//! BENCH_MATCH (seq), BENCH_SAMPLE_EVERY (1), BENCH_BEFORE_BIN and
//! BENCH_BEFORE_REV (its label), BENCH_EPPING_BIN (a built pping),
//! BENCH_EPPING_ARGS (epping::DEFAULT_ARGS); RTTSCOPE_BIN (default: the
//! rttscope binary of this program's target directory).
mod epping;
#[path = "sampler_report.rs"]
mod report;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rttscope_e2e::frames::{
    frame, icmp_frame, vlan_tagged, vxlan, Icmp, Outer, Tcp, ECHO_REPLY, ECHO_REQUEST,
};
use rttscope_e2e::{rttscope_bin, ChildGuard, Pair, RrClient, RrServer, A_ADDR, B_ADDR};
use serde_json::Value;

use report::{Phase, Proto, Table};

/// A running `rttscope observe --view sampler --format json` and the
/// (name, id) of its programs, from its start line.
struct Sampler {
    child: ChildGuard,
    progs: Vec<(String, u64)>,
}

impl Sampler {
    /// `bin`: another rttscope binary (BENCH_BEFORE_BIN), else ours.
    fn start_bin(bin: Option<&str>, args: &[String]) -> Sampler {
        let bin = bin
            .map(std::path::PathBuf::from)
            .unwrap_or_else(rttscope_bin);
        let mut cmd = std::process::Command::new(bin);
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

impl Drop for Sampler {
    /// SIGTERM (it detaches and exits cleanly), then the guard's SIGKILL.
    fn drop(&mut self) {
        if let Some(c) = self.child.0.as_ref() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let child = ChildGuard(self.child.0.take());
        let _ = child.wait_output(Duration::from_secs(10));
    }
}

fn iface(ns: &rttscope_e2e::NetNs, name: &str) -> String {
    format!("{}:{}", ns.name, name)
}

/// BPF run-time statistics while the returned fd is open (BPF_ENABLE_STATS):
/// nothing global is left changed when the benchmark ends.
fn enable_bpf_stats() -> Option<OwnedFd> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    let attr = [0u32; 4]; // enable_stats.type = BPF_STATS_RUN_TIME (0)
                          // SAFETY: bpf(2) with a zeroed attr of the size we pass.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_ptr(), 16usize) };
    // SAFETY: a fresh fd we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// ns per run of a loaded program on one frame, BPF_PROG_TEST_RUN with
/// `repeat` (time while preempted is excluded by the kernel).
fn test_run_ns(prog_id: u64, frame: &[u8], repeat: u32) -> Option<f64> {
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
    let get_fd = [prog_id as u32, 0, 0]; // prog_id, next_id, open_flags
                                         // SAFETY: bpf(2) with attrs of the sizes we pass.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_GET_FD_BY_ID,
            get_fd.as_ptr(),
            12usize,
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
        (r == 0).then_some(t.duration as f64)
    }
}

/// (run_time_ns, run_cnt) of a program.
fn prog_stats(id: u64) -> (u64, u64) {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "prog", "show", "id", &id.to_string()])
        .output()
        .expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        v["run_time_ns"].as_u64().unwrap_or(0),
        v["run_cnt"].as_u64().unwrap_or(0),
    )
}

/// Transactions per second of one request/response connection over `secs`.
fn rr_tps(pair: &Pair, server: SocketAddr, secs: f64) -> f64 {
    let c = RrClient::start(&pair.a, server, 1, Duration::ZERO).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // warm up
    let t0 = Instant::now();
    let n0 = c.transactions.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let n = c.transactions.load(Ordering::Relaxed) - n0;
    n as f64 / t0.elapsed().as_secs_f64()
}

/// ICMP echo as fast as it is answered (ping -f, root) from a to b for
/// `secs` (whole seconds, at least 1): echo replies per second.
fn icmp_flood(pair: &Pair, secs: f64) -> f64 {
    let w = secs.ceil().max(1.0) as u64;
    let t0 = Instant::now();
    let out = pair
        .a
        .command("ping")
        .args(["-q", "-f", "-w", &w.to_string(), B_ADDR])
        .output()
        .expect("ping -f");
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "{out:?}"
    );
    // "N packets transmitted, M received, ..."
    let text = String::from_utf8_lossy(&out.stdout);
    let received = text
        .split(',')
        .find_map(|f| f.trim().strip_suffix(" received"))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    received / t0.elapsed().as_secs_f64()
}

/// Loads `r0 = -1; exit` (TCX_NEXT: the chain goes on) as a classifier
/// named `name`.
fn load_noop(name: &str) -> OwnedFd {
    let insns: [u64; 2] = [
        // BPF_ALU64|BPF_MOV|BPF_K r0, imm -1 ; BPF_JMP|BPF_EXIT
        0xb7 | ((-1i32 as u32 as u64) << 32),
        0x95,
    ];
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&3u32.to_ne_bytes()); // BPF_PROG_TYPE_SCHED_CLS
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes()); // prog_name
                                                                // SAFETY: bpf(2) BPF_PROG_LOAD with a zeroed attr of the size we pass.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len()) };
    assert!(
        fd >= 0,
        "loading the floor program: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd we own.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// BPF_LINK_CREATE of `prog` at tcx `attach_type` of `ifname` in `ns`
/// (appended to the chain); closing the returned fd detaches it.
fn tcx_link(ns: &rttscope_e2e::NetNs, ifname: &str, prog: i32, attach_type: u32) -> OwnedFd {
    let ifname = ifname.to_string();
    let link = ns.run(move || {
        let c = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: if_nametoindex reads a NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
        let mut a = [0u8; 64];
        a[0..4].copy_from_slice(&(prog as u32).to_ne_bytes());
        a[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        a[8..12].copy_from_slice(&attach_type.to_ne_bytes());
        // SAFETY: bpf(2) BPF_LINK_CREATE with a zeroed attr.
        unsafe { libc::syscall(libc::SYS_bpf, 28, a.as_ptr(), a.len()) }
    });
    assert!(
        link >= 0,
        "tcx attach of the floor program: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd we own.
    unsafe { OwnedFd::from_raw_fd(link as i32) }
}

/// The floor: a do-nothing classifier per direction, attached by tcx on
/// both veth ends; the cost of being called at all (plus the run-time
/// statistics' own clock reads).
struct Floor {
    ids: Vec<(String, u64)>,
    _fds: Vec<OwnedFd>,
}

impl Floor {
    fn attach(pair: &Pair) -> Floor {
        const BPF_TCX_INGRESS: u32 = 46;
        const BPF_TCX_EGRESS: u32 = 47;
        let mut ids = Vec::new();
        let mut fds = Vec::new();
        for (name, attach_type) in [
            ("floor_egr", BPF_TCX_EGRESS),
            ("floor_ing", BPF_TCX_INGRESS),
        ] {
            let prog = load_noop(name);
            ids.push((name.to_string(), prog_id(prog.as_raw_fd())));
            for (ns, ifname) in [(&pair.a, &pair.a_if), (&pair.b, &pair.b_if)] {
                fds.push(tcx_link(ns, ifname, prog.as_raw_fd(), attach_type));
            }
            fds.push(prog);
        }
        Floor { ids, _fds: fds }
    }
}

/// A program's id from its fd (BPF_OBJ_GET_INFO_BY_FD: bpf_prog_info.id).
fn prog_id(fd: i32) -> u64 {
    // mutable: the kernel writes it (read back from an immutable array, the
    // id was folded to its initial 0 in release builds: a floor of 0 ns)
    let mut info = [0u32; 64];
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&((info.len() * 4) as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: bpf(2) with an info buffer of the length we pass.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 15, attr.as_mut_ptr(), attr.len()) };
    assert!(
        r == 0,
        "BPF_OBJ_GET_INFO_BY_FD: {}",
        std::io::Error::last_os_error()
    );
    info[1] as u64
}

/// One program of the chain, attached (dropping it detaches it).
enum Member {
    Floor(Floor),
    Sampler(Sampler),
    Epping(epping::Epping),
}

impl Member {
    /// (`egr` | `ing`, id) of its programs.
    fn progs(&self) -> Vec<(&'static str, u64)> {
        let named = match self {
            Member::Floor(f) => &f.ids,
            Member::Sampler(s) => &s.progs,
            Member::Epping(e) => &e.progs,
        };
        named
            .iter()
            .map(|(n, id)| (if n.ends_with("egr") { "egr" } else { "ing" }, *id))
            .collect()
    }
}

/// What the run compares, from the environment (module doc).
struct Setup {
    rounds: usize,
    secs: f64,
    sampler_args: Vec<String>,
    before: Option<String>,
    epping: Option<String>,
    /// ePPing's option sets, each with `epping::COMMON_ARGS` added
    epping_sets: Vec<String>,
}

impl Setup {
    fn from_env(pair: &Pair) -> Setup {
        let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let sampler_args = [
            "--iface",
            &iface(&pair.a, &pair.a_if),
            "--iface",
            &iface(&pair.b, &pair.b_if),
            "--match",
            &env("BENCH_MATCH", "seq"),
            "--sample-every",
            &env("BENCH_SAMPLE_EVERY", "1"),
            "--duration",
            "600s",
            "--interval",
            "600s",
        ]
        .map(String::from)
        .to_vec();
        let epping = std::env::var("BENCH_EPPING_BIN").ok();
        if let Some(bin) = epping
            .as_deref()
            .filter(|b| !std::path::Path::new(b).is_file())
        {
            eprintln!("bench_sampler: BENCH_EPPING_BIN={bin} is not a file (a pping built by scripts/build-epping.sh)");
            std::process::exit(2);
        }
        let sets = env("BENCH_EPPING_ARGS", epping::DEFAULT_ARGS);
        Setup {
            rounds: env("BENCH_ROUNDS", "9").parse().unwrap_or(9),
            secs: env("BENCH_SECS", "3").parse().unwrap_or(3.0),
            sampler_args,
            before: std::env::var("BENCH_BEFORE_BIN").ok(),
            epping,
            epping_sets: sets
                .split(';')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        }
    }

    /// The chain's members in attach order for round `r`: floor, before,
    /// after, epping; reversed in odd rounds.
    fn order(&self, r: usize) -> Vec<&'static str> {
        let mut o = vec!["floor"];
        if self.before.is_some() {
            o.push("before");
        }
        o.push("after");
        if self.epping.is_some() {
            o.push("epping");
        }
        if r % 2 == 1 {
            o.reverse();
        }
        o
    }

    /// Attach one member; `set`: the ePPing option set of this chain.
    fn start(&self, name: &str, pair: &Pair, set: &str, chain: &[Member]) -> Member {
        match name {
            "floor" => Member::Floor(Floor::attach(pair)),
            "before" => Member::Sampler(Sampler::start_bin(
                self.before.as_deref(),
                &self.sampler_args,
            )),
            "after" => Member::Sampler(Sampler::start_bin(None, &self.sampler_args)),
            _ => {
                let known: Vec<u64> = chain.iter().flat_map(|m| m.progs()).map(|p| p.1).collect();
                let args: Vec<String> = format!("{} {set}", epping::COMMON_ARGS)
                    .split_whitespace()
                    .map(String::from)
                    .collect();
                let bin = std::path::Path::new(self.epping.as_deref().unwrap());
                Member::Epping(epping::Epping::start(bin, &args, pair, &known))
            }
        }
    }
}

/// ns and runs per (member, direction) over what `traffic` made the
/// programs of `chain` run.
fn measured<T>(
    names: &[&str],
    chain: &[Member],
    traffic: impl FnOnce() -> T,
) -> (T, BTreeMap<(String, String), f64>) {
    let progs: Vec<(&str, &str, u64)> = names
        .iter()
        .zip(chain)
        .flat_map(|(n, m)| m.progs().into_iter().map(move |(d, id)| (*n, d, id)))
        .collect();
    let before: Vec<(u64, u64)> = progs.iter().map(|p| prog_stats(p.2)).collect();
    let rate = traffic();
    let mut sums: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for ((name, dir, id), (ns0, c0)) in progs.iter().zip(before) {
        let (ns, c) = prog_stats(*id);
        let e = sums.entry((name.to_string(), dir.to_string())).or_default();
        e.0 += ns - ns0;
        e.1 += c - c0;
    }
    let per_run = sums
        .into_iter()
        .map(|(k, (ns, c))| {
            (
                k,
                if c == 0 {
                    f64::NAN
                } else {
                    ns as f64 / c as f64
                },
            )
        })
        .collect();
    (rate, per_run)
}

/// One chain: attach every member in `order`, run the TCP flow and then the
/// ICMP flood, each measured alone; the test-run figures of the samplers
/// once (`test_run` empty).
fn chain_round(
    setup: &Setup,
    pair: &Pair,
    server: SocketAddr,
    order: &[&str],
    set: &str,
    test_run: &mut Vec<(String, f64)>,
) -> Phase {
    let mut chain: Vec<Member> = Vec::new();
    for name in order {
        let m = setup.start(name, pair, set, &chain);
        chain.push(m);
    }
    let (tps, tcp) = measured(order, &chain, || rr_tps(pair, server, setup.secs));
    let (pps, icmp) = measured(order, &chain, || icmp_flood(pair, setup.secs / 2.0));
    if test_run.is_empty() {
        for (name, m) in order.iter().zip(&chain) {
            if let (Member::Sampler(s), true) = (m, ["before", "after"].contains(name)) {
                test_run.extend(test_runs(name, s));
            }
        }
    }
    // detached in reverse order of attachment
    while let Some(m) = chain.pop() {
        drop(m);
    }
    Phase {
        order: order.iter().map(|s| s.to_string()).collect(),
        tcp: Proto { rate: tps, ns: tcp },
        icmp: Proto {
            rate: pps,
            ns: icmp,
        },
    }
}

/// Every round: one chain per ePPing option set (one chain when there is
/// no ePPing), in the order of the round; tables and a JSON line at the
/// end (sampler_report.rs).
fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "bench_sampler: needs root (it creates network namespaces and loads BPF programs)"
        );
        std::process::exit(1);
    }
    let _stats = enable_bpf_stats().expect("BPF_ENABLE_STATS");
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5009").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let setup = Setup::from_env(&pair);
    let sets: Vec<String> = if setup.epping.is_some() {
        setup.epping_sets.clone()
    } else {
        println!("bench_sampler: ePPing left out (no BENCH_EPPING_BIN; scripts/bench-sampler.sh builds it from BENCH_EPPING_SRC=/path/to/bpf-examples)");
        vec![String::new()]
    };
    let mut tables: Vec<Table> = sets.iter().map(|s| Table::new(s)).collect();
    let mut test_run = Vec::new();
    println!(
        "bench_sampler: {} rounds x ({} s TCP RR + {} s ICMP flood) per chain, sampler {}",
        setup.rounds,
        setup.secs,
        (setup.secs / 2.0).ceil().max(1.0),
        setup.sampler_args[4..8].join(" ")
    );
    for r in 0..setup.rounds {
        let order = setup.order(r);
        for (set, table) in sets.iter().zip(&mut tables) {
            let phase = chain_round(&setup, &pair, server, &order, set, &mut test_run);
            report::print_round(r, set, &phase);
            table.rounds.push(phase);
        }
    }
    report::print_all(&tables, &test_run);
}

/// BPF_PROG_TEST_RUN, 1e6 repeats, of a sampler's programs on one TCP
/// data segment / its ACK and one ICMP echo request / its reply; the same
/// TCP frames with a VLAN tag and inside VXLAN (issue 44.2: the cost of
/// the slow path; a build before issue 41 only counts them as skipped).
fn test_runs(label: &str, s: &Sampler) -> Vec<(String, f64)> {
    let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let b_ip: [u8; 4] = B_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let tcp = |src, dst, sport, dport, ack, flags, payload| {
        let t = Tcp {
            src,
            dst,
            sport,
            dport,
            seq: 1,
            ack,
            flags,
            payload,
        };
        frame(t, 0, false, 5)
    };
    let data = tcp(a_ip, b_ip, 40000, 5009, 1, 0x18, 1);
    let ack = tcp(b_ip, a_ip, 5009, 40000, 2, 0x10, 0);
    let echo = |src, dst, typ| {
        let i = Icmp {
            typ,
            id: 7,
            seq: 1,
            payload: 56,
        };
        icmp_frame(src, dst, i)
    };
    let req = echo(a_ip, b_ip, ECHO_REQUEST);
    let rep = echo(b_ip, a_ip, ECHO_REPLY);
    let outer = Outer::V4([192, 168, 9, 1], [192, 168, 9, 2]);
    let (data_vx, ack_vx) = (vxlan(outer, 4789, 42, &data), vxlan(outer, 4789, 42, &ack));
    let (data_vl, ack_vl) = (
        vlan_tagged(&data, &[(0x8100, 7)]),
        vlan_tagged(&ack, &[(0x8100, 7)]),
    );
    let mut out = Vec::new();
    for (name, id) in s.progs.iter().take(2) {
        let egr = name.ends_with("egr");
        for (what, f) in [
            ("tcp", if egr { &data } else { &ack }),
            ("icmp", if egr { &req } else { &rep }),
            ("tcp-vlan", if egr { &data_vl } else { &ack_vl }),
            ("tcp-vxlan", if egr { &data_vx } else { &ack_vx }),
        ] {
            if let Some(ns) = test_run_ns(*id, f, 1_000_000) {
                out.push((format!("{label} {name} {what}"), ns));
            }
        }
    }
    out
}
