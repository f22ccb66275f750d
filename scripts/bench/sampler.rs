//! Benchmark of the sampler view, run by scripts/bench-sampler.sh
//! (docs/perf-sampler.md): ns per run of each tc program (BPF run-time
//! statistics, enabled through BPF_ENABLE_STATS for the run only; and
//! BPF_PROG_TEST_RUN on crafted packets) and the transactions per second of
//! a full-speed TCP request/response flow between two namespaces, then an
//! ICMP echo flood (ping -f), each measured alone, for several variants in
//! the same run, rotating their order each round: no program, a do-nothing
//! program (the floor), the sampler built before (BENCH_BEFORE_BIN, an
//! older rttscope binary), this one (`rttscope observe --view sampler`
//! on both veth ends) and ePPing as a reference (BENCH_EPPING_BIN, see
//! epping.rs). Medians over the rounds are compared, and this sampler's
//! cost above the floor is given as a fraction of ePPing's.
//!
//! Environment: BENCH_ROUNDS (5), BENCH_SECS (3), BENCH_MATCH (seq),
//! BENCH_SAMPLE_EVERY (1), BENCH_BEFORE_BIN (none), BENCH_EPPING_BIN (a
//! built pping, none), BENCH_EPPING_ARGS (epping::DEFAULT_ARGS);
//! RTTSCOPE_BIN (default: the rttscope binary next to this program's target
//! directory).
mod epping;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rttscope_e2e::frames::{frame, icmp_frame, Icmp, Tcp, ECHO_REPLY, ECHO_REQUEST};
use rttscope_e2e::{rttscope_bin, ChildGuard, Pair, RrClient, RrServer, A_ADDR, B_ADDR};
use serde_json::Value;

/// A running `rttscope observe --view sampler --format json` and the
/// (name, id) of its programs, from its start line.
struct Sampler {
    child: ChildGuard,
    progs: Vec<(String, u64)>,
}

impl Sampler {
    /// `bin`: another rttscope binary (BENCH_BEFORE_BIN), else ours.
    fn start_bin(bin: Option<&str>, args: &[&str]) -> Sampler {
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

/// A do-nothing classifier (`r0 = -1; exit`: TCX_NEXT) loaded from raw
/// instructions and attached by tcx on both veth ends: the floor, the cost
/// of being called at all (plus the run-time statistics' own clock reads).
struct Floor {
    ids: Vec<(String, u64)>,
    _fds: Vec<std::os::fd::OwnedFd>,
}

impl Floor {
    fn attach(pair: &Pair) -> Floor {
        use std::os::fd::{AsRawFd, FromRawFd};
        let insns: [u64; 2] = [
            // BPF_ALU64|BPF_MOV|BPF_K r0, imm -1 ; BPF_JMP|BPF_EXIT
            0xb7 | ((-1i32 as u32 as u64) << 32),
            0x95,
        ];
        let license = b"GPL\0";
        let mut attr = [0u8; 128];
        let put32 = |a: &mut [u8; 128], off: usize, v: u32| {
            a[off..off + 4].copy_from_slice(&v.to_ne_bytes())
        };
        let put64 = |a: &mut [u8; 128], off: usize, v: u64| {
            a[off..off + 8].copy_from_slice(&v.to_ne_bytes())
        };
        put32(&mut attr, 0, 3); // BPF_PROG_TYPE_SCHED_CLS
        put32(&mut attr, 4, 2);
        put64(&mut attr, 8, insns.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        attr[48..58].copy_from_slice(b"floor_noop"); // prog_name
                                                     // SAFETY: bpf(2) BPF_PROG_LOAD with a zeroed attr of the size we pass.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len()) };
        assert!(
            fd >= 0,
            "loading the floor program: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a fresh fd we own.
        let prog = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        let id = prog_id(prog.as_raw_fd());
        let mut fds = Vec::new();
        for (ns, ifname) in [(&pair.a, pair.a_if.clone()), (&pair.b, pair.b_if.clone())] {
            for attach_type in [46u32, 47] {
                // BPF_TCX_INGRESS, BPF_TCX_EGRESS
                let (pfd, ifname) = (prog.as_raw_fd(), ifname.clone());
                let link = ns.run(move || {
                    let c = std::ffi::CString::new(ifname).unwrap();
                    // SAFETY: if_nametoindex reads a NUL-terminated string.
                    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
                    let mut a = [0u8; 64];
                    a[0..4].copy_from_slice(&(pfd as u32).to_ne_bytes());
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
                // SAFETY: a fresh fd we own; closing it detaches.
                fds.push(unsafe { std::os::fd::OwnedFd::from_raw_fd(link as i32) });
            }
        }
        fds.push(prog);
        Floor {
            ids: vec![("floor_noop".to_string(), id)],
            _fds: fds,
        }
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

/// ns per run, per program name suffix (`egr`, `ing`, or the floor's
/// name), over what `traffic` made the programs run.
fn measured(progs: &[(String, u64)], traffic: impl FnOnce()) -> Runs {
    let before: Vec<(u64, u64)> = progs.iter().map(|(_, id)| prog_stats(*id)).collect();
    traffic();
    let mut out: Runs = BTreeMap::new();
    for ((name, id), (ns0, c0)) in progs.iter().zip(before) {
        let (ns, c) = prog_stats(*id);
        let key = if name.ends_with("egr") {
            "egr"
        } else if name.ends_with("ing") {
            "ing"
        } else {
            "floor"
        };
        let e = out.entry(key.to_string()).or_default();
        e.0 += ns - ns0;
        e.1 += c - c0;
    }
    out
}

/// ICMP echo as fast as it is answered (ping -f, root) from a to b for `secs`.
fn icmp_flood(pair: &Pair, secs: f64) {
    let w = format!("{}", secs.ceil() as u64);
    let out = pair
        .a
        .command("ping")
        .args(["-q", "-f", "-w", &w, B_ADDR])
        .output()
        .expect("ping -f");
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "{out:?}"
    );
}

/// A variant: `off`, `floor`, `before` (BENCH_BEFORE_BIN), `after` (this
/// rttscope), or `epping`, `epping2`, ... (BENCH_EPPING_BIN with each
/// option set of BENCH_EPPING_ARGS); `bin` and `args` where they apply.
struct Variant {
    name: String,
    bin: Option<String>,
    args: Vec<String>,
}

impl Variant {
    fn new(name: &str, bin: Option<String>, args: Vec<String>) -> Variant {
        let name = name.to_string();
        Variant { name, bin, args }
    }
}

/// The variants of the run, from the environment (see the module doc);
/// prints one line when ePPing is skipped.
fn variants_from_env(sampler_args: &[String]) -> Vec<Variant> {
    let mut v = vec![
        Variant::new("off", None, Vec::new()),
        Variant::new("floor", None, Vec::new()),
    ];
    if let Ok(b) = std::env::var("BENCH_BEFORE_BIN") {
        v.push(Variant::new("before", Some(b), sampler_args.to_vec()));
    }
    v.push(Variant::new("after", None, sampler_args.to_vec()));
    let Ok(bin) = std::env::var("BENCH_EPPING_BIN") else {
        println!("bench_sampler: ePPing reference skipped (no BENCH_EPPING_BIN; scripts/bench-sampler.sh builds it from BENCH_EPPING_SRC=/path/to/bpf-examples)");
        return v;
    };
    if !std::path::Path::new(&bin).is_file() {
        eprintln!("bench_sampler: BENCH_EPPING_BIN={bin} is not a file (a pping built by scripts/build-epping.sh)");
        std::process::exit(2);
    }
    let sets = std::env::var("BENCH_EPPING_ARGS").unwrap_or_else(|_| epping::DEFAULT_ARGS.into());
    for (i, set) in sets.split(';').filter(|s| !s.trim().is_empty()).enumerate() {
        let name = if i == 0 {
            "epping".to_string()
        } else {
            format!("epping{}", i + 1)
        };
        let args = set.split_whitespace().map(String::from).collect();
        v.push(Variant::new(&name, Some(bin.clone()), args));
    }
    v
}

/// ns and runs per program kind over one phase (see [`measured`]).
type Runs = BTreeMap<String, (u64, u64)>;

/// One variant's round: attach it, run the TCP flow then the ICMP flood,
/// each measured alone. Returns (TPS, TCP runs, ICMP runs, the sampler, if
/// any, for the test-run figures).
fn round(
    pair: &Pair,
    server: SocketAddr,
    v: &Variant,
    secs: f64,
) -> (f64, Runs, Runs, Option<Sampler>) {
    let (mut floor, mut sampler, mut epping) = (None, None, None);
    match v.name.as_str() {
        "off" => {}
        "floor" => floor = Some(Floor::attach(pair)),
        n if n.starts_with("epping") => {
            let bin = std::path::Path::new(v.bin.as_deref().unwrap());
            epping = Some(epping::Epping::start(bin, &v.args, pair));
        }
        _ => {
            let a: Vec<&str> = v.args.iter().map(|s| s.as_str()).collect();
            sampler = Some(Sampler::start_bin(v.bin.as_deref(), &a));
        }
    }
    let progs = match (&floor, &sampler, &epping) {
        (Some(f), _, _) => f.ids.clone(),
        (_, Some(s), _) => s.progs.clone(),
        (_, _, Some(e)) => e.progs.clone(),
        _ => Vec::new(),
    };
    let mut tps = 0.0;
    let tcp = measured(&progs, || tps = rr_tps(pair, server, secs));
    let icmp = measured(&progs, || icmp_flood(pair, secs / 2.0));
    drop(epping); // stopped here: the next variant runs alone
    (tps, tcp, icmp, sampler)
}

fn per_run(m: &Runs, k: &str) -> f64 {
    m.get(k)
        .map(|(ns, c)| *ns as f64 / (*c).max(1) as f64)
        .unwrap_or(f64::NAN)
}

/// Every variant (no program, the do-nothing floor, the sampler built
/// before — BENCH_BEFORE_BIN —, this one and ePPing — BENCH_EPPING_BIN)
/// in each round, in rotating
/// order, on the same TCP request/response flow and then an ICMP echo
/// flood: TPS and ns per program run (BPF run-time statistics) per
/// variant and protocol, medians over the rounds.
fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "bench_sampler: needs root (it creates network namespaces and loads BPF programs)"
        );
        std::process::exit(1);
    }
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let rounds: usize = env("BENCH_ROUNDS", "5").parse().unwrap_or(5);
    let secs: f64 = env("BENCH_SECS", "3").parse().unwrap_or(3.0);
    let matching = env("BENCH_MATCH", "seq");
    let every = env("BENCH_SAMPLE_EVERY", "1");
    let _stats = enable_bpf_stats().expect("BPF_ENABLE_STATS");
    let pair = Pair::new().unwrap();
    let server: SocketAddr = format!("{B_ADDR}:5009").parse().unwrap();
    let _s = RrServer::start(&pair.b, server, 1).unwrap();
    let args: Vec<String> = [
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
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let variants = variants_from_env(&args);
    // per variant: TPS, TCP egr/ing ns, ICMP egr/ing ns, one per round
    let mut res: BTreeMap<String, [Vec<f64>; 5]> = BTreeMap::new();
    let mut test_run: Vec<(String, f64)> = Vec::new();
    for r in 0..rounds {
        for k in 0..variants.len() {
            let v = &variants[(r + k) % variants.len()];
            let (tps, tcp, icmp, sampler) = round(&pair, server, v, secs);
            let e = res.entry(v.name.clone()).or_default();
            for (i, x) in round_figures(r, v, tps, &tcp, &icmp).iter().enumerate() {
                e[i].push(*x);
            }
            if let (Some(s), true) = (&sampler, test_run.is_empty() && v.name == "after") {
                test_run = test_runs(s);
            }
            if let Some(s) = sampler {
                // SAFETY: end our own child (SIGTERM: it exits cleanly).
                unsafe { libc::kill(s.child.pid() as i32, libc::SIGTERM) };
                let _ = s.child.wait_output(Duration::from_secs(10));
            }
        }
    }
    let eppings: Vec<(String, String)> = variants
        .iter()
        .filter(|v| v.name.starts_with("epping"))
        .map(|v| (v.name.clone(), v.args.join(" ")))
        .collect();
    report(&matching, &every, rounds, secs, &res, &test_run, &eppings);
}

/// One round's figures of a variant, printed: TPS, TCP egr/ing, ICMP
/// egr/ing ns per run (the floor's one program counts for both hooks).
fn round_figures(r: usize, v: &Variant, tps: f64, tcp: &Runs, icmp: &Runs) -> [f64; 5] {
    let floor = v.name == "floor";
    let vals = if floor {
        let f = [per_run(tcp, "floor"), per_run(icmp, "floor")];
        [tps, f[0], f[0], f[1], f[1]]
    } else {
        let (e, i) = ("egr", "ing");
        [
            tps,
            per_run(tcp, e),
            per_run(tcp, i),
            per_run(icmp, e),
            per_run(icmp, i),
        ]
    };
    println!(
        "  round {r} {:<7}: TPS {:.0}; TCP egr {:.1} ing {:.1} ns/run; ICMP egr {:.1} ing {:.1} ns/run{}",
        v.name, vals[0], vals[1], vals[2], vals[3], vals[4],
        if floor { " (the floor program, both hooks)" } else { "" }
    );
    vals
}

/// BPF_PROG_TEST_RUN, 1e6 repeats, of the sampler's programs on one TCP
/// data segment / its ACK and one ICMP echo request / its reply.
fn test_runs(s: &Sampler) -> Vec<(String, f64)> {
    let a_ip: [u8; 4] = A_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let b_ip: [u8; 4] = B_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let tcp = |src, dst, sport, dport, ack, flags, payload| {
        frame(
            Tcp {
                src,
                dst,
                sport,
                dport,
                seq: 1,
                ack,
                flags,
                payload,
            },
            0,
            false,
            5,
        )
    };
    let data = tcp(a_ip, b_ip, 40000, 5009, 1, 0x18, 1);
    let ack = tcp(b_ip, a_ip, 5009, 40000, 2, 0x10, 0);
    let echo = |src, dst, typ| {
        icmp_frame(
            src,
            dst,
            Icmp {
                typ,
                id: 7,
                seq: 1,
                payload: 56,
            },
        )
    };
    let req = echo(a_ip, b_ip, ECHO_REQUEST);
    let rep = echo(b_ip, a_ip, ECHO_REPLY);
    let mut out = Vec::new();
    for (name, id) in s.progs.iter().take(2) {
        let egr = name.ends_with("egr");
        for (what, f) in [
            ("tcp", if egr { &data } else { &ack }),
            ("icmp", if egr { &req } else { &rep }),
        ] {
            if let Some((ns, _)) = test_run_ns(*id, f, 1_000_000) {
                out.push((format!("{name} {what}"), ns));
            }
        }
    }
    out
}

fn report(
    matching: &str,
    every: &str,
    rounds: usize,
    secs: f64,
    res: &BTreeMap<String, [Vec<f64>; 5]>,
    test_run: &[(String, f64)],
    eppings: &[(String, String)],
) {
    let ep: String = eppings
        .iter()
        .map(|(n, a)| format!("; {n}: pping {a}"))
        .collect();
    println!("sampler benchmark: match {matching}, {rounds} rounds x {secs} s TCP RR + {} s ICMP flood, both veth ends, --sample-every {every}{ep}; medians (range)", secs / 2.0);
    let fmt = |v: &[f64]| {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return "-".to_string();
        }
        let m = median(&mut v);
        format!("{m:.1} ({:.1}-{:.1})", v[0], v[v.len() - 1])
    };
    println!(
        "  {:<7} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "variant", "TPS", "TCP egr ns", "TCP ing ns", "ICMP egr ns", "ICMP ing ns"
    );
    let mut json = serde_json::Map::new();
    for (v, vals) in res {
        println!(
            "  {:<7} {:>22} {:>22} {:>22} {:>22} {:>22}",
            v,
            fmt(&vals[0]),
            fmt(&vals[1]),
            fmt(&vals[2]),
            fmt(&vals[3]),
            fmt(&vals[4])
        );
        json.insert(
            v.to_string(),
            serde_json::json!({
                "tps": vals[0], "tcp_egr_ns": vals[1], "tcp_ing_ns": vals[2],
                "icmp_egr_ns": vals[3], "icmp_ing_ns": vals[4],
            }),
        );
    }
    for (name, ns) in test_run {
        println!("  {name}: {ns:.1} ns/run in BPF_PROG_TEST_RUN (1e6 repeats of one packet)");
    }
    let mut ratios = serde_json::Map::new();
    for (ep, _) in eppings {
        for ours in ["after", "before"] {
            if let Some(r) = above_floor_ratios(res, ours, ep) {
                ratios.insert(format!("{ours}/{ep}"), r);
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "type": "bench_sampler", "match": matching, "sample_every": every, "rounds": rounds,
            "secs": secs, "epping_args": eppings.iter().map(|(n, a)| (n.clone(), Value::from(a.clone()))).collect::<serde_json::Map<_, _>>(), "variants": json,
            "ratio_above_floor_to_epping": ratios,
            "test_run_ns": test_run.iter().map(|(n, ns)| serde_json::json!({"name": n, "ns_per_run": ns})).collect::<Vec<_>>(),
        })
    );
}

/// `(ours - floor) / (epping - floor)` per direction and protocol: of the medians over
/// the rounds, and per round (each round has every variant, run one after
/// the other on the same flow), printed and returned for the JSON line.
/// None without an ePPing or a floor figure.
fn above_floor_ratios(
    res: &BTreeMap<String, [Vec<f64>; 5]>,
    ours: &str,
    epping: &str,
) -> Option<Value> {
    let (o, f, e) = (res.get(ours)?, res.get("floor")?, res.get(epping)?);
    let med = |v: &[f64]| {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let mut line = format!("  ({ours} - floor) / ({epping} - floor):");
    let mut json = serde_json::Map::new();
    for (i, what) in [
        (1, "tcp_egr"),
        (2, "tcp_ing"),
        (3, "icmp_egr"),
        (4, "icmp_ing"),
    ] {
        let of_medians = match (med(&o[i]), med(&f[i]), med(&e[i])) {
            (Some(o), Some(f), Some(e)) => (o - f) / (e - f),
            _ => f64::NAN,
        };
        let mut per_round: Vec<f64> = (0..o[i].len().min(f[i].len()).min(e[i].len()))
            .map(|r| (o[i][r] - f[i][r]) / (e[i][r] - f[i][r]))
            .filter(|x| x.is_finite())
            .collect();
        let paired = med(&per_round);
        per_round.sort_by(|a, b| a.partial_cmp(b).unwrap());
        line += &match paired {
            Some(p) => format!(
                " {what} {of_medians:.2} (per round {p:.2}, {:.2}-{:.2});",
                per_round[0],
                per_round[per_round.len() - 1]
            ),
            None => format!(" {what} -;"),
        };
        json.insert(
            what.to_string(),
            serde_json::json!({"of_medians": of_medians, "per_round_median": paired, "per_round": per_round}),
        );
    }
    println!("{}", line.trim_end_matches(';'));
    Some(Value::Object(json))
}
