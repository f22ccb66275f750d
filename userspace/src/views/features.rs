//! What this kernel allows, found out once by trying it: tiny programs
//! loaded, attached and discarded (as `bpftool feature probe` and libbpf's
//! own probes do), never a version number. Distribution kernels backport
//! features and leave others out (our own 6.18 refuses fentry/fexit), so a
//! version says little; a probe says what this kernel does.
//!
//! Each view picks its path from [`Features`], the same under both loaders
//! (the probes are raw bpf(2) calls, `crate::sys::bpfprog`), and the
//! feature-report command (`rttscope features`) prints them.
//!
//! | capability | how it is probed |
//! |---|---|
//! | `atomics` | a socket filter using BPF_CMPXCHG and BPF_XCHG on its stack loads |
//! | `rtt_cb_args` | a sock_ops program attached (link) at the cgroup v2 root for a few ms turns on the RTT callback of one loopback connection of ours and records `args[1]` (the new srtt x 8): nonzero = the callback carries the sample. Nothing in BTF marks it: the change (6.10) only passed two values where zeros went before. |
//! | `ack_hook` | a fexit program on `tcp_ack_update_rtt` (its BTF id) loads and attaches |
//! | `sk_storage_fexit` | a fexit program calling `bpf_sk_storage_get` is not refused with `unknown func` (libbpf's helper-probe method; 5.11 upstream): the atomics build's hook finds a socket's flow in its socket storage. Where no fexit program loads, no (the question does not arise) |
//! | `iter_setsockopt` | an `iter/tcp` program calls `bpf_setsockopt(TCP_BPF_SOCK_OPS_CB_FLAGS)` on that connection's client socket and writes the helper's result into the iterator's output: 0 = allowed. The verifier accepts the call on 6.1, the helper refuses the option at run time there. |
//! | `tcx` | a classifier returning TCX_NEXT attached to `lo` by a tcx link (BPF_LINK_CREATE, BPF_TCX_INGRESS) and closed at once |
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::sys::bpfprog::{self as bp, asm, Insn, ProgSpec};

/// One capability: whether this kernel has it, and what the probe saw.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Capability {
    pub name: &'static str,
    pub ok: bool,
    /// False when the probe could not run here (not a kernel answer: e.g. no
    /// loopback connection in this network namespace); `ok` is then false too.
    pub probed: bool,
    /// What the probe saw (the error when refused; why not, when not probed).
    pub detail: String,
}

/// What this kernel allows (probed once per process: [`Features::get`]).
#[derive(Debug, Clone, Serialize)]
pub struct Features {
    pub kernel: String,
    /// BTF, privileges, cgroup v2: without them nothing loads.
    pub btf: Capability,
    pub privileges: Capability,
    pub cgroup2: Capability,
    pub atomics: Capability,
    pub rtt_cb_args: Capability,
    /// fexit on tcp_ack_update_rtt loads and attaches.
    pub ack_hook: Capability,
    /// bpf_sk_storage_get is known to fexit programs.
    pub sk_storage_fexit: Capability,
    pub iter_setsockopt: Capability,
    pub tcx: Capability,
    /// Set where no probe reaches the kernel because this process's seccomp filter refuses
    /// bpf() (`crate::sys::bpf::seccomp_refusal`): the sentence saying so. The kernel's answers
    /// are then unknown (every probe `probed: false`), not "no".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bpf_refused: Option<&'static str>,
}

fn cap(name: &'static str, r: Result<String, String>) -> Capability {
    match r {
        Ok(detail) => Capability {
            name,
            ok: true,
            probed: true,
            detail,
        },
        Err(detail) => Capability {
            name,
            ok: false,
            probed: true,
            detail,
        },
    }
}

/// A probe that could not run here: no answer about the kernel.
fn not_probed(name: &'static str, why: String) -> Capability {
    Capability {
        name,
        ok: false,
        probed: false,
        detail: format!("not probed: {why}"),
    }
}

impl Features {
    /// The probes' answers, run on first use and kept for the process.
    pub fn get() -> &'static Features {
        static F: OnceLock<Features> = OnceLock::new();
        F.get_or_init(Features::probe)
    }

    /// Run every probe now.
    pub fn probe() -> Features {
        let btf = cap(
            "btf",
            crate::sys::preflight::require_btf()
                .map(|_| "/sys/kernel/btf/vmlinux".into())
                .map_err(|e| e.to_string()),
        );
        let privileges = cap(
            "privileges",
            crate::sys::preflight::require_bpf_caps()
                .map(|_| "CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN".into())
                .map_err(|e| e.to_string()),
        );
        let cgroup2 = cap(
            "cgroup2",
            crate::sys::preflight::cgroup2_root()
                .map(|p| p.display().to_string())
                .map_err(|e| e.to_string()),
        );
        if let Some(why) = crate::sys::bpf::seccomp_refusal() {
            return Features::unknown([btf, privileges, cgroup2], why);
        }
        let (rtt_cb_args, iter_setsockopt) = match probe_tcp_callbacks() {
            Ok((rtt, iter)) => (cap("rtt_cb_args", rtt), cap("iter_setsockopt", iter)),
            Err(why) => (
                not_probed("rtt_cb_args", why.clone()),
                not_probed("iter_setsockopt", why),
            ),
        };
        let (ack_hook, sk_storage_fexit) = probe_fexit();
        Features {
            kernel: crate::sys::preflight::kernel_release(),
            btf,
            privileges,
            cgroup2,
            atomics: cap("atomics", probe_atomics()),
            rtt_cb_args,
            ack_hook,
            sk_storage_fexit,
            iter_setsockopt,
            tcx: cap("tcx", probe_tcx()),
            bpf_refused: None,
        }
    }

    /// Where bpf() never reaches the kernel (`why`: a seccomp filter refuses it): the host
    /// checks as found, every kernel probe not run.
    fn unknown([btf, privileges, cgroup2]: [Capability; 3], why: &'static str) -> Features {
        let unknown = |name| not_probed(name, "this process's seccomp filter refuses bpf()".into());
        Features {
            kernel: crate::sys::preflight::kernel_release(),
            btf,
            privileges,
            cgroup2,
            atomics: unknown("atomics"),
            rtt_cb_args: unknown("rtt_cb_args"),
            ack_hook: unknown("ack_hook"),
            sk_storage_fexit: unknown("sk_storage_fexit"),
            iter_setsockopt: unknown("iter_setsockopt"),
            tcx: unknown("tcx"),
            bpf_refused: Some(why),
        }
    }

    /// Every capability, in report order.
    pub fn all(&self) -> [&Capability; 9] {
        [
            &self.btf,
            &self.privileges,
            &self.cgroup2,
            &self.atomics,
            &self.rtt_cb_args,
            &self.ack_hook,
            &self.sk_storage_fexit,
            &self.iter_setsockopt,
            &self.tcx,
        ]
    }

    /// Why `observe` cannot load its views here, if it cannot.
    pub fn blocker(&self) -> Option<String> {
        [&self.btf, &self.privileges, &self.cgroup2]
            .into_iter()
            .find(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
    }

    /// Whether the per-ACK hook of the object loaded here can be used (`--ack-hook auto` asks
    /// for it where it is needed). The atomics build's hook finds every flow in its socket
    /// storage, so it needs `sk_storage_fexit` too; the build without atomics (< 5.12) has a
    /// hook that times only the connections open before attach, found by address in a table
    /// the iterator fills (no socket storage: 5.10 has none in tracing programs).
    pub fn ack_hook_usable(&self) -> bool {
        self.ack_hook.ok && (!self.atomics_choice().used || self.sk_storage_fexit.ok)
    }

    /// Whether the per-ACK hook has every RTT sample here (the atomics build's hook).
    fn ack_hook_times_all(&self) -> bool {
        self.ack_hook_usable() && self.atomics_choice().used
    }

    /// Where the TCP view's RTT samples come from here (connections opened after attach).
    pub fn tcp_rtt_path(&self) -> TcpRttPath {
        if self.rtt_cb_args.ok {
            TcpRttPath::RttCbArgs
        } else if self.ack_hook_times_all() {
            TcpRttPath::AckHook
        } else if !self.rtt_cb_args.probed {
            TcpRttPath::RttCb
        } else {
            TcpRttPath::SrttFallback
        }
    }

    /// How connections open before attach are timed here.
    pub fn existing_path(&self) -> ExistingPath {
        if !self.atomics_choice().used {
            // the build without atomics (< 5.12): the iterator records them in a table for
            // the per-ACK hook where it loads and attaches (bpf/tcp.bpf.c), else no path
            return if self.ack_hook_usable() {
                ExistingPath::AckHookTable
            } else {
                ExistingPath::None
            };
        }
        // Not probed: the iterator tries anyway (its refusals are counted).
        let hook = self.ack_hook_times_all();
        if self.iter_setsockopt.ok || (!self.iter_setsockopt.probed && !hook) {
            ExistingPath::Iterator
        } else if hook {
            ExistingPath::AckHook
        } else {
            ExistingPath::None
        }
    }

    /// How the sampler attaches with `--attach auto`.
    pub fn sampler_attach(&self) -> &'static str {
        if self.tcx.ok {
            "tcx"
        } else {
            "clsact"
        }
    }
}

/// Which build of the kernel objects a view loads: with BPF atomics that
/// return a value (`tcp.bpf.o`), or the build without them
/// (`tcp_noatomic.bpf.o`, bpf/*.c with RTTSCOPE_NO_ATOMICS) where the
/// `atomics` probe says they are refused (< 5.12), or where the test setting
/// `RTTSCOPE_BPF_ATOMICS=off` asks for it (so the host suite runs both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtomicsChoice {
    /// Load the objects that use atomics with a result.
    pub used: bool,
    /// Why, in a few words (start line, result settings, `features`).
    pub why: String,
}

/// The environment variable that forces the objects without atomics (tests).
pub const ATOMICS_ENV: &str = "RTTSCOPE_BPF_ATOMICS";

impl Features {
    /// Which object build to load here (the same under both loaders).
    pub fn atomics_choice(&self) -> AtomicsChoice {
        if std::env::var(ATOMICS_ENV).is_ok_and(|v| v == "off") {
            return AtomicsChoice {
                used: false,
                why: format!("forced by {ATOMICS_ENV}=off (a test setting)"),
            };
        }
        if self.atomics.ok {
            AtomicsChoice {
                used: true,
                why: "BPF atomics with a result (atomics probe)".into(),
            }
        } else {
            AtomicsChoice {
                used: false,
                why: format!(
                    "this kernel refuses BPF atomics with a result ({})",
                    self.atomics.detail
                ),
            }
        }
    }
}

/// Where the TCP view's RTT samples come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpRttPath {
    /// BPF_SOCK_OPS_RTT_CB's arguments (the sample and the new srtt).
    RttCbArgs,
    /// fexit on tcp_ack_update_rtt: the sample tcp_rtt_estimator() gets.
    AckHook,
    /// RTT_CB without arguments: TCP's srtt before each update.
    SrttFallback,
    /// RTT_CB, not probed here (no loopback connection to probe with): the
    /// kernel program takes the arguments where they are passed and srtt
    /// where not (counted as srtt_fallback_samples).
    RttCb,
}

/// How connections open before attach get samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExistingPath {
    /// The iterator turns their RTT callback on (bpf_setsockopt).
    Iterator,
    /// The iterator records them (socket storage); the per-ACK hook times them.
    AckHook,
    /// The build without atomics (< 5.12): the iterator records them in a bounded table by
    /// socket address (`tcp_existing`), the per-ACK hook times them from there.
    AckHookTable,
    /// Not timed: no path on this kernel.
    None,
}

fn load(spec: ProgSpec<'_>, insns: &[Insn]) -> Result<OwnedFd, String> {
    bp::prog_load(spec, insns).map_err(|e| e.to_string())
}

/// BPF_CMPXCHG and BPF_XCHG (kernel 5.12+ upstream) on the stack.
fn probe_atomics() -> Result<String, String> {
    let p = [
        asm::mov_imm(1, 0),
        asm::stx(8, 10, 1, -8),
        asm::mov_imm(0, 0),
        asm::mov_imm(2, 1),
        asm::atomic64(0xf1, 10, 2, -8), // r0 = cmpxchg(r10-8, r0, r2)
        asm::mov_imm(2, 2),
        asm::atomic64(0xe1, 10, 2, -8), // r2 = xchg(r10-8, r2)
        asm::mov_imm(0, 0),
        asm::exit(),
    ];
    let spec = ProgSpec {
        prog_type: bp::PROG_SOCKET_FILTER,
        name: "rtt_probe_atom",
        ..Default::default()
    };
    load(spec, &p).map(|_| "BPF_CMPXCHG and BPF_XCHG load".into())
}

/// fexit on tcp_ack_update_rtt (loads and attaches: `ack_hook`), and whether fexit programs
/// know bpf_sk_storage_get (`sk_storage_fexit`): two answers, since 5.10 gives the first and
/// not the second (the build without atomics' hook does without socket storage).
fn probe_fexit() -> (Capability, Capability) {
    let spec = match crate::sys::btf::vmlinux_func_id("tcp_ack_update_rtt") {
        Ok(id) => ProgSpec {
            prog_type: bp::PROG_TRACING,
            expected_attach_type: bp::ATTACH_TRACE_FEXIT,
            attach_btf_id: id,
            name: "rtt_probe_fexit",
        },
        Err(e) => {
            let why = format!("no fexit program to try: {e}");
            return (
                cap("ack_hook", Err(e.to_string())),
                cap("sk_storage_fexit", Err(why)),
            );
        }
    };
    let prog = match load(spec, &[asm::mov_imm(0, 0), asm::exit()]) {
        Ok(p) => p,
        Err(e) => {
            let why = format!("no fexit program loads here, so none can call it ({e})");
            return (cap("ack_hook", Err(e)), cap("sk_storage_fexit", Err(why)));
        }
    };
    let attached = bp::tracing_attach(&prog)
        .map(drop)
        .map(|_| "fexit/tcp_ack_update_rtt loads and attaches".to_string())
        .map_err(|e| format!("attach: {e}"));
    (
        cap("ack_hook", attached),
        cap("sk_storage_fexit", sk_storage_in_tracing(spec)),
    )
}

/// The atomics build's hook finds a socket's flow through its socket storage:
/// is bpf_sk_storage_get known to fexit programs (5.11 upstream)? As libbpf's
/// helper probes: a call with arguments the verifier refuses (an array map,
/// a NULL socket) fails with "unknown func" only where the helper is missing.
fn sk_storage_in_tracing(spec: ProgSpec<'_>) -> Result<String, String> {
    const SK_STORAGE_GET: i32 = 107;
    let map = bp::array_map(8).map_err(|e| format!("probe map: {e}"))?;
    let mut p = asm::ld_map_fd(1, map.as_raw_fd()).to_vec();
    p.extend([
        asm::mov_imm(2, 0),
        asm::mov_imm(3, 0),
        asm::mov_imm(4, 0),
        asm::call(SK_STORAGE_GET),
        asm::mov_imm(0, 0),
        asm::exit(),
    ]);
    match bp::prog_load(spec, &p) {
        Err(e) if e.to_string().contains("unknown func") || e.to_string().contains("invalid func") => {
            Err(format!("fexit programs cannot call bpf_sk_storage_get here: the hook finds connections open before attach by address instead, in the build without atomics ({e})"))
        }
        _ => Ok("fexit programs know bpf_sk_storage_get (a call with invalid arguments is refused for them, not as unknown)".into()),
    }
}

/// A tcx link on lo, closed at once.
fn probe_tcx() -> Result<String, String> {
    let spec = ProgSpec {
        prog_type: bp::PROG_SCHED_CLS,
        name: "rtt_probe_tcx",
        ..Default::default()
    };
    let prog = load(spec, &[asm::mov_imm(0, -1), asm::exit()])?;
    // SAFETY: a NUL-terminated literal.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err("no loopback interface to try a tcx link on".into());
    }
    bp::link_create(&prog, lo, bp::ATTACH_TCX_INGRESS)
        .map(|_| "a tcx link attaches (tried on lo, closed at once)".into())
        .map_err(|e| format!("tcx link: {e}"))
}

/// One loopback connection of ours (client, accepted server socket).
struct Conn {
    client: TcpStream,
    server: TcpStream,
}

impl Conn {
    fn open(listener: &TcpListener) -> std::io::Result<Conn> {
        // Bounded: on a `lo` set down after it was up the SYNs are dropped and a
        // plain connect() waits out its retries (~2 min).
        let client = TcpStream::connect_timeout(&listener.local_addr()?, Duration::from_secs(2))?;
        let (server, _) = listener.accept()?;
        for s in [&client, &server] {
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.set_nodelay(true)?;
        }
        Ok(Conn { client, server })
    }

    /// Server-to-client data, read by the client: the server's ACK-driven RTT samples.
    fn exchange(&mut self, rounds: usize) -> std::io::Result<()> {
        let mut buf = [0u8; 64];
        for _ in 0..rounds {
            self.server.write_all(&buf)?;
            self.client.read_exact(&mut buf)?;
            self.client.write_all(&buf[..1])?;
            self.server.read_exact(&mut buf[..1])?;
        }
        Ok(())
    }
}

/// The probes' result type: what the kernel answered, or why not.
type Answer = Result<String, String>;

/// The RTT callback's arguments and bpf_setsockopt from iter/tcp, both on
/// one loopback connection of ours. `Err`: no loopback connection can be made
/// in this network namespace (e.g. `lo` down in a fresh one), so neither
/// probe can run: that says nothing about the kernel.
fn probe_tcp_callbacks() -> Result<(Answer, Answer), String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("no loopback socket in this network namespace: {e}"))?;
    // One connection first: where none can be made the probes cannot run.
    drop(Conn::open(&listener).map_err(|e| {
        format!("no loopback connection in this network namespace ({e}; is lo up?)")
    })?);
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let rtt = probe_rtt_cb_args(&listener, port);
    let iter = Conn::open(&listener)
        .map_err(|e| format!("loopback connection: {e}"))
        .and_then(|c| probe_iter_setsockopt(&c));
    Ok((rtt, iter))
}

/// sock_ops program: on the passive side of connections to `port`, turn
/// the RTT callback on; at each RTT callback record args[0], args[1] and a count.
fn rtt_cb_prog(map: &OwnedFd, port: u16) -> Vec<Insn> {
    const OUT: i16 = 25;
    let mut p = vec![
        asm::mov(6, 1),
        asm::ldx(4, 2, 6, 68), // local_port
        asm::jne_imm(2, port as i32, OUT - 3),
        asm::ldx(4, 2, 6, 0),  // op
        asm::jne_imm(2, 5, 5), // PASSIVE_ESTABLISHED_CB
        asm::mov(1, 6),
        asm::ldx(4, 2, 6, 84), // bpf_sock_ops_cb_flags
        asm::or_imm(2, 8),     // | BPF_SOCK_OPS_RTT_CB_FLAG
        asm::call(59),         // bpf_sock_ops_cb_flags_set
        asm::ja(OUT - 10),
        asm::jne_imm(2, 12, OUT - 11), // BPF_SOCK_OPS_RTT_CB
        asm::ldx(4, 7, 6, 4),          // args[0]
        asm::ldx(4, 8, 6, 8),          // args[1]
        asm::st_imm(4, 10, -4, 0),
    ];
    p.extend(asm::ld_map_fd(1, map.as_raw_fd()));
    p.extend([
        asm::mov(2, 10),
        asm::add_imm(2, -4),
        asm::call(1), // bpf_map_lookup_elem
        asm::jeq_imm(0, 0, OUT - 20),
        asm::stx(4, 0, 7, 0),
        asm::stx(4, 0, 8, 4),
        asm::ldx(8, 1, 0, 8),
        asm::add_imm(1, 1),
        asm::stx(8, 0, 1, 8),
        asm::mov_imm(0, 1),
        asm::exit(),
    ]);
    debug_assert_eq!(p.len(), OUT as usize + 2);
    p
}

fn probe_rtt_cb_args(listener: &TcpListener, port: u16) -> Result<String, String> {
    let map = bp::array_map(16).map_err(|e| format!("map: {e}"))?;
    let spec = ProgSpec {
        prog_type: bp::PROG_SOCK_OPS,
        name: "rtt_probe_rttcb",
        ..Default::default()
    };
    let prog = load(spec, &rtt_cb_prog(&map, port))?;
    let (cg, _) = crate::sys::preflight::open_cgroup(None).map_err(|e| format!("{e:#}"))?;
    let link = bp::link_create(&prog, cg.as_raw_fd() as u32, bp::ATTACH_CGROUP_SOCK_OPS)
        .map_err(|e| format!("attaching sock_ops at the cgroup v2 root: {e}"))?;
    let mut conn = Conn::open(listener).map_err(|e| format!("loopback connection: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut v = [0u8; 16];
    loop {
        conn.exchange(4)
            .map_err(|e| format!("loopback traffic: {e}"))?;
        bp::array_get(&map, &mut v).map_err(|e| format!("map read: {e}"))?;
        let n = u64::from_ne_bytes(v[8..].try_into().unwrap_or_default());
        if n > 0 || Instant::now() > deadline {
            break;
        }
    }
    drop(link);
    let (a0, a1, n) = (
        u32::from_ne_bytes(v[0..4].try_into().unwrap_or_default()),
        u32::from_ne_bytes(v[4..8].try_into().unwrap_or_default()),
        u64::from_ne_bytes(v[8..].try_into().unwrap_or_default()),
    );
    match (n, a1) {
        (0, _) => Err("no RTT callback seen on a loopback connection within 3 s".into()),
        (_, 0) => Err(format!(
            "{n} RTT callbacks carried no arguments (args[0] = args[1] = 0)"
        )),
        _ => Ok(format!(
            "{n} RTT callbacks, last sample {a0} us, srtt {} us",
            a1 >> 3
        )),
    }
}

/// iter/tcp program: for the socket whose local port is `port`, call
/// bpf_setsockopt(SOL_TCP, TCP_BPF_SOCK_OPS_CB_FLAGS, 0) and write its
/// result (8 bytes) to the iterator's output.
fn iter_prog(port: u16) -> Vec<Insn> {
    const OUT: i16 = 24;
    vec![
        asm::mov(6, 1),
        asm::ldx(8, 7, 6, 8), // ctx->sk_common
        asm::jeq_imm(7, 0, OUT - 3),
        asm::mov(1, 7),
        asm::call(137), // bpf_skc_to_tcp_sock
        asm::jeq_imm(0, 0, OUT - 6),
        asm::mov(8, 0),
        asm::ldx(2, 2, 8, 14), // __sk_common.skc_num
        asm::jne_imm(2, port as i32, OUT - 9),
        asm::st_imm(4, 10, -4, 0),
        asm::mov(1, 8),
        asm::mov_imm(2, 6),    // SOL_TCP
        asm::mov_imm(3, 1008), // TCP_BPF_SOCK_OPS_CB_FLAGS
        asm::mov(4, 10),
        asm::add_imm(4, -4),
        asm::mov_imm(5, 4),
        asm::call(49), // bpf_setsockopt
        asm::stx(8, 10, 0, -16),
        asm::ldx(8, 1, 6, 0), // ctx->meta
        asm::ldx(8, 1, 1, 0), // meta->seq
        asm::mov(2, 10),
        asm::add_imm(2, -16),
        asm::mov_imm(3, 8),
        asm::call(127), // bpf_seq_write
        asm::mov_imm(0, 0),
        asm::exit(),
    ]
}

fn probe_iter_setsockopt(conn: &Conn) -> Result<String, String> {
    let port = conn
        .client
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())?;
    let id = crate::sys::btf::vmlinux_func_id("bpf_iter_tcp").map_err(|e| e.to_string())?;
    let spec = ProgSpec {
        prog_type: bp::PROG_TRACING,
        expected_attach_type: bp::ATTACH_TRACE_ITER,
        attach_btf_id: id,
        name: "rtt_probe_iter",
    };
    let prog = load(spec, &iter_prog(port))?;
    let link = bp::link_create(&prog, 0, bp::ATTACH_TRACE_ITER)
        .map_err(|e| format!("iterator link: {e}"))?;
    let mut out = Vec::new();
    bp::iter_create(&link)
        .and_then(|mut f| f.read_to_end(&mut out))
        .map_err(|e| format!("reading the iterator: {e}"))?;
    let Some(r) = out.get(..8) else {
        return Err("the iterator did not see the probe's own connection".into());
    };
    match i64::from_ne_bytes(r.try_into().unwrap_or_default()) {
        0 => Ok("bpf_setsockopt(TCP_BPF_SOCK_OPS_CB_FLAGS) from iter/tcp returns 0".into()),
        e => Err(format!(
            "bpf_setsockopt(TCP_BPF_SOCK_OPS_CB_FLAGS) from iter/tcp returns {e} ({})",
            std::io::Error::from_raw_os_error(-e as i32)
        )),
    }
}

/// What one view will do on a kernel with these features (`rttscope features`): its fields of
/// the report's `views` object (its paths and object build, by name), its lines, and what it
/// misses here, in sentences. Each view's folder writes its own (`plan.rs`); the registry lists
/// them (`crate::views::plans`).
#[derive(Debug, Default)]
pub struct ViewPlan {
    pub fields: serde_json::Map<String, serde_json::Value>,
    pub lines: Vec<String>,
    pub missing: Vec<String>,
}

impl ViewPlan {
    /// `fields` must be a JSON object (anything else adds no field).
    pub fn new(fields: serde_json::Value, lines: Vec<String>, missing: Vec<String>) -> ViewPlan {
        let fields = match fields {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        ViewPlan {
            fields,
            lines,
            missing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(
        atomics: bool,
        rtt_args: bool,
        fexit: bool,
        sk_storage: bool,
        iter: bool,
    ) -> Features {
        let c = |name, ok| Capability {
            name,
            ok,
            probed: true,
            detail: String::new(),
        };
        Features {
            kernel: "test".into(),
            btf: c("btf", true),
            privileges: c("privileges", true),
            cgroup2: c("cgroup2", true),
            atomics: c("atomics", atomics),
            rtt_cb_args: c("rtt_cb_args", rtt_args),
            ack_hook: c("ack_hook", fexit),
            sk_storage_fexit: c("sk_storage_fexit", sk_storage),
            iter_setsockopt: c("iter_setsockopt", iter),
            tcx: c("tcx", false),
            bpf_refused: None,
        }
    }

    /// The paths of the kernels measured in a guest (docs/kernels.md), from their answers.
    #[test]
    fn paths_follow_the_answers() {
        if std::env::var(ATOMICS_ENV).is_ok() {
            return; // forced build: not the answers' choice
        }
        // 5.10: fexit attaches, no socket storage in it, no atomics
        let f = answers(false, false, true, false, false);
        assert!(f.ack_hook_usable());
        assert_eq!(f.tcp_rtt_path(), TcpRttPath::SrttFallback);
        assert_eq!(f.existing_path(), ExistingPath::AckHookTable);
        // 5.10 refusing fexit too
        let f = answers(false, false, false, false, false);
        assert_eq!(f.existing_path(), ExistingPath::None);
        // 6.1
        let f = answers(true, false, true, true, false);
        assert_eq!(f.tcp_rtt_path(), TcpRttPath::AckHook);
        assert_eq!(f.existing_path(), ExistingPath::AckHook);
        // an atomics kernel whose fexit programs lack socket storage: no hook
        let f = answers(true, false, true, false, false);
        assert!(!f.ack_hook_usable());
        assert_eq!(f.tcp_rtt_path(), TcpRttPath::SrttFallback);
        assert_eq!(f.existing_path(), ExistingPath::None);
        // 6.12 and 6.18
        let f = answers(true, true, false, false, true);
        assert_eq!(f.tcp_rtt_path(), TcpRttPath::RttCbArgs);
        assert_eq!(f.existing_path(), ExistingPath::Iterator);
    }

    #[test]
    fn programs_have_their_exits_where_the_jumps_go() {
        let map = bp::array_map(16);
        if let Ok(map) = map {
            let p = rtt_cb_prog(&map, 1234);
            assert_eq!(p[25].code, 0xb7);
            assert_eq!(p[26].code, 0x95);
        }
        let p = iter_prog(1234);
        assert_eq!(p.len(), 26);
        assert_eq!(p[24].code, 0xb7);
    }
}
