//! The probe engine: TCP_RR, UDP_RR and ICMP echo transactions, paced, timed
//! with CLOCK_MONOTONIC right around the send and receive system calls (TCP,
//! UDP), or from the kernel's receive timestamp as ping does (ICMP, see
//! `icmp.rs`).
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use super::cancel::{cancelled, Cancel};
use super::framing::{
    carried_cookie, cookie_request, decode_cookie, write_cookie, Hello, UdpHeader, FLAG_NODELAY,
    HELLO_ACK, UDP_COOKIE_REQ_MIN, UDP_HEADER_LEN, UDP_MAX,
};
use super::icmp::{IcmpSocket, Reply, SendStamp, MIN_PAYLOAD};
use crate::analysis::stats::{HdrRecorder, NetperfHist, NetperfPercentiles, Summary};
use crate::sys::clock::mono_ns;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    TcpRr,
    UdpRr,
    Icmp,
}

impl Kind {
    /// netperf's / ping's name for the test.
    pub fn label(self) -> &'static str {
        match self {
            Kind::TcpRr => "TCP_RR",
            Kind::UdpRr => "UDP_RR",
            Kind::Icmp => "ICMP_ECHO",
        }
    }
}

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Start no transaction after this long.
    Duration(Duration),
    /// After this many transactions.
    Count(u64),
    /// After this many transactions, or this long, whichever comes first
    /// (ping's `-c` with `-w`).
    CountOrDuration(u64, Duration),
}

/// Called with (sequence number, RTT in ns) for every reply as it arrives:
/// ping's line per reply. The sequence number is the request's (ICMP, UDP)
/// or the transaction's (TCP), counted from 1.
#[derive(Clone)]
pub struct ReplyHook(std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>);

impl ReplyHook {
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        ReplyHook(std::sync::Arc::new(f))
    }
}

impl std::fmt::Debug for ReplyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyHook")
    }
}

/// How the TCP_RR hot loop does its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// Blocking send()/recv() on a dedicated thread (`spawn_blocking`), as
    /// netperf does: the fewest system calls and wake-ups per transaction.
    BlockingThread,
    /// Non-blocking sockets driven by the tokio reactor (EAGAIN, epoll_wait, wake).
    TokioReactor,
}

#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub kind: Kind,
    /// Host name or address as given.
    pub target: String,
    /// The responder's port (TCP/UDP; ignored for ICMP).
    pub port: u16,
    /// Time between the starts of bursts; zero = back to back.
    pub interval: Duration,
    /// Transactions per interval (one after the other).
    pub burst: u32,
    pub req_size: u32,
    pub resp_size: u32,
    pub stop: Stop,
    /// Wait for the next interval by spinning on the clock instead of
    /// sleeping (netperf's `--enable-spin`). The reply is still waited for
    /// in a blocking receive, as netperf does.
    pub spin: bool,
    /// Wait for the reply by polling the socket (non-blocking receives in a
    /// loop) instead of sleeping in the kernel: no wake-up in the sample, one
    /// CPU busy. Not netperf's; ping does it at intervals under ~10 ms.
    pub busy_poll: bool,
    /// TCP_NODELAY on both ends (TCP).
    pub nodelay: bool,
    /// A reply not received within this long is lost (UDP, ICMP); a TCP
    /// transaction taking longer fails the run.
    pub timeout: Duration,
    /// Keep at most this many per-transaction samples (the summary then comes
    /// from the HDR histogram; counts and histograms still see every sample).
    pub max_samples: usize,
    /// TCP_RR only (UDP and ICMP always use the reactor). Default: blocking thread.
    pub io: IoMode,
    /// Told of every reply as it arrives (none by default).
    pub on_reply: Option<ReplyHook>,
}

impl ProbeConfig {
    pub fn new(kind: Kind, target: &str) -> Self {
        let (req, resp) = match kind {
            Kind::Icmp => (
                super::icmp::DEFAULT_PAYLOAD as u32,
                super::icmp::DEFAULT_PAYLOAD as u32,
            ),
            _ => (1, 1),
        };
        ProbeConfig {
            kind,
            target: target.to_string(),
            port: super::serve::DEFAULT_PORT,
            interval: Duration::ZERO,
            burst: 1,
            req_size: req,
            resp_size: resp,
            stop: Stop::Duration(Duration::from_secs(10)),
            spin: false,
            busy_poll: false,
            nodelay: false,
            timeout: Duration::from_secs(1),
            max_samples: 1_000_000,
            io: IoMode::BlockingThread,
            on_reply: None,
        }
    }
}

/// The settings of a run, recorded with its result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    pub kind: Kind,
    pub target: String,
    pub address: IpAddr,
    pub port: u16,
    pub interval_ns: u64,
    pub burst: u32,
    /// Bytes actually sent per request / expected per response (UDP and ICMP
    /// raise small sizes to their 16-byte header; ICMP sizes are the echo payload).
    pub req_size: u32,
    pub resp_size: u32,
    pub duration_s: Option<f64>,
    pub count: Option<u64>,
    /// The pacing wait spins (`--spin`, netperf's `--enable-spin`).
    pub spin: bool,
    /// The reply is busy-polled (`--busy-poll`) instead of waited for asleep.
    #[serde(default)]
    pub busy_poll: bool,
    pub nodelay: bool,
    pub timeout_ns: u64,
    /// How the time between bursts is waited: "none (back to back)", "spin",
    /// "sleep (timerfd)" (in the reactor) or "sleep (clock_nanosleep)" (TCP_RR's blocking thread).
    pub pacing: String,
    /// How the RTT is timed. TCP_RR and UDP_RR: "CLOCK_MONOTONIC" (userspace,
    /// around the send and receive calls). ICMP: "kernel rx timestamp
    /// (SO_TIMESTAMPNS), realtime send stamp" when replies carried the kernel's
    /// receive time (as in ping), "userspace monotonic" when none did
    /// (see `counts.rx_timestamp_fallbacks`).
    pub clock: String,
    /// ICMP only: "dgram" or "raw".
    pub icmp_socket: Option<String>,
    /// How the transactions' I/O was done.
    pub io: IoMode,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub sent: u64,
    /// Replies received within the timeout (one per transaction).
    pub received: u64,
    /// Transactions without a reply within the timeout (includes those whose reply came late).
    pub lost: u64,
    /// Replies that arrived after their transaction had timed out.
    pub late: u64,
    /// Second and further replies to the same request.
    pub duplicates: u64,
    /// Replies older than the newest reply already received.
    pub reordered: u64,
    /// Send/receive errors (e.g. connection refused).
    pub errors: u64,
    /// Datagrams that were not replies to us (bad header, foreign ICMP).
    pub foreign: u64,
    /// Samples not kept in `samples` because of `max_samples`.
    pub samples_dropped: u64,
    /// ICMP: replies timed in userspace (CLOCK_MONOTONIC) because no kernel
    /// receive timestamp came with them, or it was inconsistent (a realtime
    /// clock step between send and receive).
    #[serde(default)]
    pub rx_timestamp_fallbacks: u64,
    /// UDP: requests sent again because the server answered with a new cookie
    /// instead of the (larger) response (see `framing.rs`); the transaction is
    /// timed from the second send.
    #[serde(default)]
    pub cookie_refreshes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeResult {
    pub settings: Settings,
    /// Wall-clock start, seconds since the Unix epoch (for humans; every
    /// duration is from CLOCK_MONOTONIC, except ICMP RTTs: `settings.clock`).
    pub start_unix_s: f64,
    /// From the first send to the end of the last transaction.
    pub elapsed_s: f64,
    /// The run's length, what `throughput` divides by: `-l` for a run that
    /// reached its end (netperf's definition), else (`-n COUNT`, cancelled,
    /// failed) `elapsed_s`.
    #[serde(default)]
    pub run_s: f64,
    pub counts: Counts,
    /// RTT summary in microseconds.
    pub summary: Summary,
    /// "exact" (from every sample) or "hdr" (HDR histogram, when samples were dropped).
    pub summary_source: String,
    /// P50/P90/P99 from a netperf-style histogram, whole microseconds.
    pub netperf: NetperfPercentiles,
    /// Transactions (replies received) per second of the run: `counts.received / run_s`.
    pub throughput: f64,
    pub throughput_units: String,
    /// Per transaction: (offset of the send from the start, RTT), nanoseconds.
    pub samples: Vec<(u64, u64)>,
    /// Last error seen, if any.
    pub last_error: Option<String>,
    /// What identifies this probe's packets, and its window (not saved: `compare` selects the
    /// passive views' samples with it).
    #[serde(skip)]
    pub ident: ProbeIdent,
}

/// What identifies one probe's packets to the passive views, and when it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeIdent {
    /// TCP_RR and UDP_RR: the probe socket's own address (`getsockname`); with the target's
    /// address it is the 4-tuple of every packet of the probe.
    pub local: Option<SocketAddr>,
    /// ICMP: the echo identifier (a datagram socket's "port", or the raw socket's own).
    pub icmp_id: Option<u16>,
    /// The first transaction's send (CLOCK_MONOTONIC, ns).
    pub start_mono_ns: u64,
    /// The end of the last transaction (CLOCK_MONOTONIC, ns).
    pub end_mono_ns: u64,
}

impl ProbeIdent {
    /// Whether a monotonic time falls inside the probe's window.
    pub fn in_window(&self, ts_ns: u64) -> bool {
        ts_ns >= self.start_mono_ns && ts_ns <= self.end_mono_ns
    }
}

struct Recorder {
    start: u64,
    /// The sequence number of the reply being recorded (for `on_reply`).
    seq: u64,
    on_reply: Option<ReplyHook>,
    samples: Vec<(u64, u64)>,
    max_samples: usize,
    hdr: HdrRecorder,
    np: NetperfHist,
    counts: Counts,
    last_error: Option<String>,
}

impl Recorder {
    fn sample(&mut self, t0: u64, t1: u64) {
        self.sample_rtt(t0, t1.saturating_sub(t0));
    }
    /// A sample sent at `t0` (CLOCK_MONOTONIC) whose RTT was measured otherwise.
    fn sample_rtt(&mut self, t0: u64, rtt: u64) {
        self.counts.received += 1;
        if let Some(h) = &self.on_reply {
            let seq = if self.seq > 0 {
                self.seq
            } else {
                self.counts.received
            };
            (h.0)(seq, rtt);
        }
        self.hdr.record_ns(rtt);
        self.np.record_ns(rtt);
        if self.samples.len() < self.max_samples {
            self.samples.push((t0 - self.start, rtt));
        } else {
            self.counts.samples_dropped += 1;
        }
    }
    fn error(&mut self, e: impl std::fmt::Display) {
        self.counts.errors += 1;
        self.last_error = Some(e.to_string());
    }
}

/// Paces transactions: bursts of `burst` transactions, bursts starting every
/// `interval` on a fixed grid (t0, t0+i, t0+2i, ...). A burst that could not
/// start on time (the previous one ran long, or the process was not scheduled)
/// starts at once; if it is late by an interval or more the grid restarts
/// from now, so missed bursts are skipped rather than sent back to back.
struct Pacer {
    interval: u64,
    burst: u32,
    in_burst: u32,
    next: u64,
    spin: bool,
    timer: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
}

impl Pacer {
    fn new(cfg: &ProbeConfig) -> Result<Self> {
        let blocking = cfg.kind == Kind::TcpRr && cfg.io == IoMode::BlockingThread;
        let timer = if cfg.interval.is_zero() || cfg.spin || blocking {
            None
        } else {
            // SAFETY: plain syscall; the fd is checked and then owned.
            let fd = unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error()).context("creating a timerfd");
            }
            // SAFETY: fd is a freshly created, valid descriptor we own.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: the OwnedFd stays open for as long as the AsyncFd holds it.
            let afd = unsafe { tokio::io::unix::AsyncFd::register(owned) }
                .map_err(std::io::Error::from)
                .context("registering the timerfd")?;
            Some(afd)
        };
        Ok(Pacer {
            interval: cfg.interval.as_nanos() as u64,
            burst: cfg.burst.max(1),
            in_burst: 0,
            next: 0,
            spin: cfg.spin,
            timer,
        })
    }

    /// When the next transaction may start (monotonic ns); 0 = now.
    fn next_start(&self) -> u64 {
        if self.interval == 0 || self.in_burst != 0 {
            0
        } else {
            self.next
        }
    }

    /// Wait until the next transaction may start. Returns false if cancelled.
    /// Advance the schedule for the next transaction; returns the deadline
    /// to wait for, if it may not start now.
    fn plan(&mut self) -> Option<u64> {
        if self.interval == 0 {
            return None;
        }
        let mut wait = None;
        if self.in_burst == 0 {
            let now = mono_ns();
            let start = if now < self.next {
                wait = Some(self.next);
                self.next
            } else if self.next != 0 && now - self.next < self.interval {
                // Late by less than an interval: start now but keep the grid.
                self.next
            } else {
                // First burst, or late by an interval or more: restart the grid.
                now
            };
            self.next = start + self.interval;
        }
        self.in_burst = (self.in_burst + 1) % self.burst;
        wait
    }

    /// Wait until the next transaction may start. Returns false if cancelled.
    async fn wait(&mut self, cancel: &mut Cancel) -> Result<bool> {
        match self.plan() {
            Some(deadline) => self.wait_until(deadline, cancel).await,
            None => Ok(true),
        }
    }

    /// The same from a blocking thread: spin, or clock_nanosleep to the
    /// absolute deadline in slices of at most 100 ms. False if `stop` is set.
    fn wait_blocking(&mut self, stop: &AtomicBool) -> bool {
        let Some(deadline) = self.plan() else {
            return true;
        };
        let mut i = 0u32;
        loop {
            let now = mono_ns();
            if now >= deadline {
                return true;
            }
            if self.spin {
                std::hint::spin_loop();
                i = i.wrapping_add(1);
                if i.is_multiple_of(4096) && stop.load(Ordering::Relaxed) {
                    return false;
                }
                continue;
            }
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let until = deadline.min(now + 100_000_000);
            let ts = libc::timespec {
                tv_sec: (until / 1_000_000_000) as libc::time_t,
                tv_nsec: (until % 1_000_000_000) as libc::c_long,
            };
            // SAFETY: plain syscall with a valid timespec; EINTR just loops.
            unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &ts,
                    std::ptr::null_mut(),
                );
            }
        }
    }

    async fn wait_until(&mut self, deadline: u64, cancel: &mut Cancel) -> Result<bool> {
        if self.spin {
            let mut i = 0u32;
            while mono_ns() < deadline {
                std::hint::spin_loop();
                i = i.wrapping_add(1);
                if i.is_multiple_of(4096) && *cancel.borrow() {
                    return Ok(false);
                }
            }
            return Ok(true);
        }
        let timer = self.timer.as_ref().expect("timer exists when sleeping");
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid fd and a fully initialised itimerspec.
        let rc = unsafe {
            libc::timerfd_settime(
                timer.get_ref().as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("arming the timerfd");
        }
        loop {
            tokio::select! {
                _ = cancelled(cancel) => return Ok(false),
                r = timer.readable() => {
                    let mut g = r.context("waiting on the timerfd")?;
                    let mut b = [0u8; 8];
                    match nix::unistd::read(g.get_inner().as_raw_fd(), &mut b) {
                        Ok(_) => return Ok(true),
                        Err(nix::errno::Errno::EAGAIN) => g.clear_ready(),
                        Err(e) => return Err(e).context("reading the timerfd"),
                    }
                }
            }
        }
    }
}

async fn resolve(cfg: &ProbeConfig) -> Result<SocketAddr> {
    if let Ok(ip) = cfg.target.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, cfg.port));
    }
    let host = cfg.target.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, cfg.port));
    }
    tokio::net::lookup_host((host, cfg.port))
        .await
        .with_context(|| format!("resolving {}", cfg.target))?
        .next()
        .with_context(|| format!("{} has no address", cfg.target))
}

/// Run one probe to completion (or until `cancel`), in-process.
pub async fn run_probe(cfg: &ProbeConfig, mut cancel: Cancel) -> Result<ProbeResult> {
    if cfg.burst == 0 {
        bail!("burst must be at least 1");
    }
    if cfg.req_size == 0 || cfg.resp_size == 0 {
        bail!("request and response sizes must be at least 1 byte");
    }
    if cfg.kind == Kind::UdpRr && (cfg.req_size > UDP_MAX || cfg.resp_size > UDP_MAX) {
        bail!("UDP request and response sizes are limited to {UDP_MAX} bytes");
    }
    if cfg.kind == Kind::Icmp && cfg.req_size > 65000 {
        bail!("ICMP payload is limited to 65000 bytes");
    }
    if cfg.timeout.is_zero() {
        bail!("the reply timeout must be above zero");
    }
    // Precise wake-ups from the timerfd: 1 ns timer slack for this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let addr = resolve(cfg).await?;
    let (req_size, resp_size) = match cfg.kind {
        Kind::TcpRr => (cfg.req_size, cfg.resp_size),
        Kind::UdpRr => {
            let req = cfg.req_size.max(UDP_HEADER_LEN as u32);
            let resp = cfg.resp_size.max(UDP_HEADER_LEN as u32);
            // A response larger than its request needs a cookie, carried in
            // bytes 16..24 of every request (see framing.rs).
            if resp > req {
                (req.max(UDP_COOKIE_REQ_MIN as u32), resp)
            } else {
                (req, resp)
            }
        }
        Kind::Icmp => {
            let p = cfg.req_size.max(MIN_PAYLOAD as u32);
            (p, p)
        }
    };
    let mut settings = Settings {
        kind: cfg.kind,
        target: cfg.target.clone(),
        address: addr.ip(),
        port: if cfg.kind == Kind::Icmp { 0 } else { cfg.port },
        interval_ns: cfg.interval.as_nanos() as u64,
        burst: cfg.burst,
        req_size,
        resp_size,
        duration_s: match cfg.stop {
            Stop::Duration(d) | Stop::CountOrDuration(_, d) => Some(d.as_secs_f64()),
            Stop::Count(_) => None,
        },
        count: match cfg.stop {
            Stop::Count(n) | Stop::CountOrDuration(n, _) => Some(n),
            Stop::Duration(_) => None,
        },
        spin: cfg.spin,
        busy_poll: cfg.busy_poll,
        nodelay: cfg.nodelay,
        timeout_ns: cfg.timeout.as_nanos() as u64,
        pacing: if cfg.interval.is_zero() {
            "none (back to back)".into()
        } else if cfg.spin {
            "spin".into()
        } else if cfg.kind == Kind::TcpRr && cfg.io == IoMode::BlockingThread {
            "sleep (clock_nanosleep)".into()
        } else {
            "sleep (timerfd)".into()
        },
        clock: "CLOCK_MONOTONIC".into(),
        icmp_socket: None,
        io: if cfg.kind == Kind::TcpRr {
            cfg.io
        } else {
            IoMode::TokioReactor
        },
    };
    let mut pacer = Pacer::new(cfg)?;
    let mut rec = Recorder {
        start: 0,
        seq: 0,
        on_reply: cfg.on_reply.clone(),
        samples: Vec::with_capacity(cfg.max_samples.min(1 << 16)),
        max_samples: cfg.max_samples,
        hdr: HdrRecorder::new(),
        np: NetperfHist::new(),
        counts: Counts::default(),
        last_error: None,
    };
    let start_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);

    let mut ident = ProbeIdent::default();
    let end_ns = match cfg.kind {
        Kind::TcpRr => {
            let mut conn =
                TcpConn::connect(addr, req_size, resp_size, cfg.nodelay, cfg.timeout).await?;
            ident.local = conn.s.local_addr().ok();
            if cfg.io == IoMode::BlockingThread {
                let (r, end) = tcp_blocking(conn, cfg, addr, pacer, rec, &mut cancel).await?;
                rec = r;
                end
            } else {
                tcp_loop(&mut conn, cfg, addr, &mut pacer, &mut rec, &mut cancel).await?
            }
        }
        Kind::UdpRr | Kind::Icmp => {
            let sock = if cfg.kind == Kind::UdpRr {
                let bind: SocketAddr = if addr.is_ipv4() {
                    "0.0.0.0:0".parse().unwrap()
                } else {
                    "[::]:0".parse().unwrap()
                };
                let u = UdpSocket::bind(bind)
                    .await
                    .context("binding a UDP socket")?;
                u.connect(addr)
                    .await
                    .with_context(|| format!("connecting UDP to {addr}"))?;
                ident.local = u.local_addr().ok();
                let peer = UdpPeer {
                    sock: u,
                    cookie_mode: resp_size > req_size,
                    cookie: AtomicU64::new(0),
                    has_cookie: AtomicBool::new(false),
                };
                if peer.cookie_mode {
                    peer.handshake(cfg.timeout, &mut cancel).await;
                }
                DgramSock::Udp(peer)
            } else {
                let s = IcmpSocket::open(addr.ip()).context("opening an ICMP socket")?;
                settings.icmp_socket = Some(s.kind.name().to_string());
                DgramSock::Icmp(s)
            };
            let end = dgram_loop(
                &sock,
                cfg,
                req_size,
                resp_size,
                &mut pacer,
                &mut rec,
                &mut cancel,
            )
            .await?;
            if let DgramSock::Icmp(s) = &sock {
                // After the first send: a datagram socket is bound to its identifier then.
                ident.icmp_id = s.identifier();
                let stamped = rec.counts.received - rec.counts.rx_timestamp_fallbacks;
                settings.clock = if s.rx_timestamps && stamped > 0 {
                    super::icmp::CLOCK_KERNEL_RX
                } else {
                    super::icmp::CLOCK_USERSPACE
                }
                .into();
            }
            end
        }
    };
    let elapsed_s = end_ns.saturating_sub(rec.start) as f64 / 1e9;
    ident.start_mono_ns = rec.start;
    ident.end_mono_ns = end_ns;
    let run_s = run_length(cfg.stop, rec.counts.sent, *cancel.borrow(), elapsed_s);
    let (summary, source) = if rec.counts.samples_dropped == 0 {
        let ns: Vec<u64> = rec.samples.iter().map(|s| s.1).collect();
        (Summary::from_ns(&ns), "exact")
    } else {
        (rec.hdr.summary(), "hdr")
    };
    Ok(ProbeResult {
        settings,
        start_unix_s,
        elapsed_s,
        run_s,
        summary,
        summary_source: source.into(),
        netperf: NetperfPercentiles::of(&rec.np),
        throughput: if run_s > 0.0 {
            rec.counts.received as f64 / run_s
        } else {
            0.0
        },
        throughput_units: "Trans/s".into(),
        counts: rec.counts,
        samples: rec.samples,
        last_error: rec.last_error,
        ident,
    })
}

/// What throughput divides by: the run length `-l` when the run reached it
/// (netperf: transactions / test length, so a 10 ms-paced `-l 4` reads
/// 100.00/s, not 400 / 3.99 s), otherwise the time from the first send to the
/// end of the last transaction (`-n`, a count reached before `-w`, a cancel).
fn run_length(stop: Stop, sent: u64, cancelled: bool, elapsed_s: f64) -> f64 {
    match stop {
        Stop::Duration(d) if !cancelled => d.as_secs_f64(),
        Stop::CountOrDuration(n, d) if !cancelled && sent < n => d.as_secs_f64(),
        _ => elapsed_s,
    }
}

/// TCP_RR on a dedicated blocking thread: the socket is switched to blocking
/// mode, and every transaction is one send() and as many recv() as the
/// response needs, exactly like netperf and the bare loop (`--busy-poll`:
/// non-blocking recv() in a loop). Cancellation and the transaction timeout
/// come from a watchdog that shuts the socket down.
async fn tcp_blocking(
    conn: TcpConn,
    cfg: &ProbeConfig,
    addr: SocketAddr,
    mut pacer: Pacer,
    mut rec: Recorder,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    use std::sync::atomic::AtomicU64;
    let s = conn.s.into_std().context("detaching the socket")?;
    // --busy-poll polls the reply: non-blocking reads in a loop. Otherwise
    // (also with --spin, which spins only the pacing wait) plain blocking calls without SO_RCVTIMEO (which would arm a kernel timer
    // on every blocking recv); timeouts and cancel come from the watchdog below.
    s.set_nonblocking(cfg.busy_poll)?;
    s.set_write_timeout(Some(cfg.timeout))?;
    // Shared so the descriptor stays open until both sides are done with it.
    let sock = Arc::new(s);
    let fd = sock.as_raw_fd();
    let (req, mut resp) = (conn.req, conn.resp);
    let stop_flag = Arc::new(AtomicBool::new(false));
    let timed_out = Arc::new(AtomicBool::new(false));
    let inflight = Arc::new(AtomicU64::new(0));
    let (stop2, timed_out2, inflight2, sock2) = (
        stop_flag.clone(),
        timed_out.clone(),
        inflight.clone(),
        sock.clone(),
    );
    let (stop_at, timeout, busy_poll) = (cfg.stop, cfg.timeout, cfg.busy_poll);
    let mut handle = tokio::task::spawn_blocking(move || -> Result<(Recorder, u64)> {
        use std::io::{Read, Write};
        // SAFETY: prctl on the calling thread only.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        let mut s: &std::net::TcpStream = &sock2;
        rec.start = mono_ns();
        let stop = StopAt::new(stop_at, rec.start);
        let timeout_ns = timeout.as_nanos() as u64;
        // How a failed read or write ends the run.
        let ended =
            |rec: &mut Recorder, what: &str, e: Option<std::io::Error>| -> Result<Option<u64>> {
                if stop2.load(Ordering::Relaxed) {
                    // Cancelled mid-transaction: it does not count.
                    rec.counts.sent -= 1;
                    return Ok(Some(mono_ns()));
                }
                if timed_out2.load(Ordering::Relaxed) {
                    bail!(
                        "TCP transaction {} with {addr} took longer than {timeout:?}",
                        rec.counts.sent
                    );
                }
                match e {
                    Some(e) => {
                        rec.error(&e);
                        Err(e).context(format!(
                            "TCP transaction {} with {addr}: {what}",
                            rec.counts.sent
                        ))
                    }
                    None => bail!(
                        "TCP transaction {} with {addr}: the responder closed the connection",
                        rec.counts.sent
                    ),
                }
            };
        loop {
            if stop.done(rec.counts.sent, pacer.next_start()) {
                break;
            }
            if !pacer.wait_blocking(&stop2) || stop2.load(Ordering::Relaxed) {
                break;
            }
            rec.counts.sent += 1;
            let t0 = mono_ns();
            inflight2.store(t0, Ordering::Relaxed);
            if let Err(e) = s.write_all(&req) {
                if let Some(end) = ended(&mut rec, "sending a request", Some(e))? {
                    return Ok((rec, end));
                }
            }
            let mut got = 0;
            while got < resp.len() {
                match s.read(&mut resp[got..]) {
                    Ok(0) => {
                        if let Some(end) = ended(&mut rec, "receiving a response", None)? {
                            return Ok((rec, end));
                        }
                    }
                    Ok(n) => got += n,
                    Err(e) if busy_poll && e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::hint::spin_loop();
                        if stop2.load(Ordering::Relaxed) {
                            rec.counts.sent -= 1;
                            return Ok((rec, mono_ns()));
                        }
                        if mono_ns() - t0 > timeout_ns {
                            bail!(
                                "TCP transaction {} with {addr} took longer than {timeout:?}",
                                rec.counts.sent
                            );
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        if let Some(end) = ended(&mut rec, "receiving a response", Some(e))? {
                            return Ok((rec, end));
                        }
                    }
                }
            }
            let t1 = mono_ns();
            inflight2.store(0, Ordering::Relaxed);
            rec.sample(t0, t1);
        }
        Ok((rec, mono_ns()))
    });
    // The watchdog: on cancel, or a transaction older than the timeout, shut
    // the socket down; the blocked recv() returns and the thread ends.
    let period = (cfg.timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let run_end = StopAt::new(cfg.stop, mono_ns()).end;
    let mut fired = false;
    let r = loop {
        tokio::select! {
            r = &mut handle => break r,
            _ = cancelled(cancel), if !fired => {
                stop_flag.store(true, Ordering::Relaxed);
                fired = true;
            }
            _ = tick.tick(), if !fired => {
                match in_flight_verdict(inflight.load(Ordering::Relaxed), run_end, timeout_ns) {
                    InFlight::Ended => stop_flag.store(true, Ordering::Relaxed),
                    InFlight::TimedOut => timed_out.store(true, Ordering::Relaxed),
                    InFlight::Waiting => {}
                }
                fired = stop_flag.load(Ordering::Relaxed) || timed_out.load(Ordering::Relaxed);
            }
        }
        if fired {
            // SAFETY: `sock` keeps the descriptor open.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    };
    drop(sock);
    r.context("the probe thread panicked")?
}

/// TCP_RR transactions. The hot path has no per-transaction timer or
/// cancellation future: a watchdog running beside it (same task) checks the
/// in-flight transaction's age every `timeout / 4` (at most 100 ms) and on a
/// timeout or a cancel shuts the socket down, which ends the pending read.
async fn tcp_loop(
    conn: &mut TcpConn,
    cfg: &ProbeConfig,
    addr: SocketAddr,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    cancel: &mut Cancel,
) -> Result<u64> {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
    const TIMED_OUT: u8 = 1;
    const CANCELLED: u8 = 2;
    let inflight = AtomicU64::new(0);
    let fired = AtomicU8::new(0);
    let fd = conn.s.as_raw_fd();
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let run_end = StopAt::new(cfg.stop, mono_ns()).end;
    let mut cancel2 = cancel.clone();
    let watchdog = async {
        let period = (cfg.timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(100));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    match in_flight_verdict(inflight.load(Relaxed), run_end, timeout_ns) {
                        InFlight::Ended => {
                            fired.store(CANCELLED, Relaxed);
                            break;
                        }
                        InFlight::TimedOut => {
                            fired.store(TIMED_OUT, Relaxed);
                            break;
                        }
                        InFlight::Waiting => {}
                    }
                }
                _ = cancelled(&mut cancel2) => {
                    fired.store(CANCELLED, Relaxed);
                    break;
                }
            }
        }
        // SAFETY: fd belongs to the connection, which outlives this future.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
        std::future::pending::<()>().await
    };
    let main = async {
        rec.start = mono_ns();
        let stop = StopAt::new(cfg.stop, rec.start);
        loop {
            if stop.done(rec.counts.sent, pacer.next_start()) {
                break;
            }
            if !pacer.wait(cancel).await? || *cancel.borrow() {
                break;
            }
            rec.counts.sent += 1;
            if (cfg.spin || cfg.busy_poll) && rec.counts.sent.is_multiple_of(256) {
                // Let the signal watcher (and the watchdog) run now and then.
                tokio::task::yield_now().await;
            }
            let r = if cfg.busy_poll {
                match conn.transaction_busy_poll(mono_ns() + timeout_ns) {
                    Ok(Some(t)) => Ok(t),
                    Ok(None) => bail!(
                        "TCP transaction {} with {addr} took longer than {:?}",
                        rec.counts.sent,
                        cfg.timeout
                    ),
                    Err(e) => Err(e),
                }
            } else {
                inflight.store(mono_ns(), Relaxed);
                let r = conn.transaction().await;
                inflight.store(0, Relaxed);
                r
            };
            match r {
                Ok((t0, t1)) => rec.sample(t0, t1),
                Err(_) if fired.load(Relaxed) == CANCELLED => {
                    rec.counts.sent -= 1;
                    break;
                }
                Err(_) if fired.load(Relaxed) == TIMED_OUT => bail!(
                    "TCP transaction {} with {addr} took longer than {:?}",
                    rec.counts.sent,
                    cfg.timeout
                ),
                Err(e) => {
                    rec.error(&e);
                    return Err(e)
                        .context(format!("TCP transaction {} with {addr}", rec.counts.sent));
                }
            }
        }
        Ok(mono_ns())
    };
    tokio::select! {
        biased;
        r = main => r,
        _ = watchdog => unreachable!("the watchdog never completes"),
    }
}

/// What the watchdog makes of the transaction in flight (started at `inflight`, 0: none).
#[derive(Debug, PartialEq, Eq)]
enum InFlight {
    Waiting,
    /// Older than -W: the run fails, as before.
    TimedOut,
    /// Still in flight after -l is over (TCP's backoff under loss): it ends with the run and
    /// does not count, as a transaction netperf's -l timer interrupts.
    Ended,
}

fn in_flight_verdict(inflight: u64, run_end: u64, timeout_ns: u64) -> InFlight {
    if inflight == 0 {
        return InFlight::Waiting;
    }
    let now = mono_ns();
    if now > run_end {
        InFlight::Ended
    } else if now.saturating_sub(inflight) > timeout_ns {
        InFlight::TimedOut
    } else {
        InFlight::Waiting
    }
}

struct StopAt {
    stop: Stop,
    end: u64,
}

impl StopAt {
    fn new(stop: Stop, start: u64) -> Self {
        let end = match stop {
            Stop::Duration(d) | Stop::CountOrDuration(_, d) => {
                start.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64)
            }
            Stop::Count(_) => u64::MAX,
        };
        StopAt { stop, end }
    }
    /// Done when the count is reached, or when the next transaction would start at or after the end.
    fn done(&self, sent: u64, next_start: u64) -> bool {
        let late = || mono_ns().max(next_start) >= self.end;
        match self.stop {
            Stop::Count(n) => sent >= n,
            Stop::Duration(_) => late(),
            Stop::CountOrDuration(n, _) => sent >= n || late(),
        }
    }
}

/// A failed connect in one sentence that says what the error means.
fn connect_error(addr: SocketAddr, e: std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => anyhow::anyhow!(
            "connecting to {addr}: refused (nothing listens on port {} there: start `rttscope serve` on that host, which listens on every address by default, or give its port with -p)",
            addr.port()
        ),
        _ => anyhow::anyhow!("connecting to {addr}: {e}"),
    }
}

struct TcpConn {
    s: TcpStream,
    req: Vec<u8>,
    resp: Vec<u8>,
}

impl TcpConn {
    async fn connect(
        addr: SocketAddr,
        req: u32,
        resp: u32,
        nodelay: bool,
        timeout: Duration,
    ) -> Result<Self> {
        let mut s = tokio::time::timeout(
            timeout.max(Duration::from_secs(3)),
            TcpStream::connect(addr),
        )
        .await
        .with_context(|| format!("connecting to {addr}: timed out"))?
        .map_err(|e| connect_error(addr, e))?;
        if nodelay {
            s.set_nodelay(true)?;
        }
        let hello = Hello {
            req,
            resp,
            flags: if nodelay { FLAG_NODELAY } else { 0 },
        };
        s.write_all(&hello.encode())
            .await
            .context("sending the hello")?;
        let mut ack = [0u8; 4];
        match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut ack)).await {
            Ok(Ok(_)) if ack == HELLO_ACK => {}
            Ok(Ok(_)) => bail!("{addr} is not an rttscope responder (bad hello reply)"),
            Ok(Err(_)) => bail!(
                "{addr} closed the connection after the hello (sizes over its limit, or its connection limit reached; see its log)"
            ),
            Err(_) => bail!("{addr} did not answer the hello within 5 s"),
        }
        Ok(TcpConn {
            s,
            req: vec![b'q'; req as usize],
            resp: vec![0u8; resp as usize],
        })
    }

    /// One transaction: (just before send, just after the last byte of the response).
    async fn transaction(&mut self) -> Result<(u64, u64)> {
        let t0 = mono_ns();
        self.s
            .write_all(&self.req)
            .await
            .context("sending a request")?;
        self.s
            .read_exact(&mut self.resp)
            .await
            .context("receiving a response")?;
        Ok((t0, mono_ns()))
    }

    /// One transaction without ever sleeping (--busy-poll): the response is
    /// busy-polled with non-blocking recv() until complete or `deadline`.
    fn transaction_busy_poll(&mut self, deadline: u64) -> Result<Option<(u64, u64)>> {
        let fd = self.s.as_raw_fd();
        let t0 = mono_ns();
        let mut off = 0;
        while off < self.req.len() {
            match sys_io(unsafe {
                libc::send(
                    fd,
                    self.req[off..].as_ptr().cast(),
                    self.req.len() - off,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            }) {
                Ok(n) => off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e).context("sending a request"),
            }
        }
        let mut got = 0;
        let mut i = 0u32;
        while got < self.resp.len() {
            match sys_io(unsafe {
                libc::recv(
                    fd,
                    self.resp[got..].as_mut_ptr().cast(),
                    self.resp.len() - got,
                    libc::MSG_DONTWAIT,
                )
            }) {
                Ok(0) => bail!("the responder closed the connection"),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop();
                    i = i.wrapping_add(1);
                    if i.is_multiple_of(1024) && mono_ns() > deadline {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e).context("receiving a response"),
            }
        }
        Ok(Some((t0, mono_ns())))
    }
}

/// A raw syscall result as io::Result.
fn sys_io(rc: isize) -> std::io::Result<usize> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

enum DgramSock {
    Udp(UdpPeer),
    Icmp(IcmpSocket),
}

/// A UDP_RR socket and, when responses are larger than requests, the
/// server's cookie (see `framing.rs`).
struct UdpPeer {
    sock: UdpSocket,
    /// Responses are larger than requests: requests carry the cookie.
    cookie_mode: bool,
    cookie: AtomicU64,
    has_cookie: AtomicBool,
}

/// What a receive brought.
enum Rx {
    Reply(Reply),
    /// UDP: the server sent a new cookie instead of the response.
    NewCookie,
    /// Not a reply to us.
    Foreign,
}

impl UdpPeer {
    /// Before the clock starts: ask for a cookie, up to three times, each
    /// waiting up to the reply timeout. Without one the run still starts (an
    /// older server answers without); a server that wants one answers the
    /// first request with a cookie and the request is sent again.
    async fn handshake(&self, timeout: Duration, cancel: &mut Cancel) {
        let mut buf = vec![0u8; 65536 + 64];
        for _ in 0..3 {
            if let Err(e) = self.sock.send(&cookie_request()).await {
                tracing::debug!("UDP cookie request: {e}");
                tokio::time::sleep(Duration::from_millis(10).min(timeout)).await;
                continue;
            }
            let until = tokio::time::Instant::now() + timeout;
            loop {
                tokio::select! {
                    r = tokio::time::timeout_at(until, self.sock.recv(&mut buf)) => match r {
                        Err(_) => break,
                        Ok(Ok(n)) => {
                            if matches!(self.classify(&buf[..n]), Rx::NewCookie) {
                                return;
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::debug!("UDP cookie reply: {e}");
                            tokio::time::sleep(Duration::from_millis(10).min(timeout)).await;
                            break;
                        }
                    },
                    _ = cancelled(cancel) => return,
                }
            }
        }
        tracing::warn!(
            "no UDP cookie from the server after 3 tries; sending requests without one (responses larger than requests need one from rttscope serve)"
        );
    }

    /// Classify a received datagram; take the cookie from a cookie datagram or
    /// from bytes 16..24 of a response (the server's current one).
    fn classify(&self, d: &[u8]) -> Rx {
        if let Ok(h) = UdpHeader::decode(d) {
            if self.cookie_mode {
                if let Some(c) = carried_cookie(d) {
                    self.set_cookie(c);
                }
            }
            return Rx::Reply(udp_reply(h));
        }
        match decode_cookie(d) {
            Some(c) if self.cookie_mode => {
                self.set_cookie(c);
                Rx::NewCookie
            }
            _ => Rx::Foreign,
        }
    }

    fn set_cookie(&self, c: u64) {
        self.cookie.store(c, Ordering::Relaxed);
        self.has_cookie.store(true, Ordering::Relaxed);
    }
}

impl DgramSock {
    /// Non-blocking receive straight to the syscall (for busy polling; bypasses
    /// the reactor). Ok(None): nothing there.
    fn try_recv(&self, buf: &mut [u8], foreign: &mut u64) -> std::io::Result<Option<Rx>> {
        match self {
            DgramSock::Udp(u) => {
                let r = sys_io(unsafe {
                    libc::recv(
                        u.sock.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                });
                match r {
                    Ok(n) => Ok(Some(u.classify(&buf[..n]))),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                    Err(e) => Err(e),
                }
            }
            DgramSock::Icmp(s) => Ok(s
                .try_recv(buf, foreign)?
                .map(|r| r.map_or(Rx::Foreign, Rx::Reply))),
        }
    }

    /// Send request `seq`. ICMP returns its send time on both clocks, read
    /// immediately before `sendto()`; UDP keeps the caller's monotonic `t0`.
    async fn send(
        &self,
        buf: &mut [u8],
        seq: u64,
        resp: u32,
    ) -> std::io::Result<Option<SendStamp>> {
        match self {
            DgramSock::Udp(u) => {
                UdpHeader { resp, seq }.write(buf);
                if u.cookie_mode && u.has_cookie.load(Ordering::Relaxed) {
                    write_cookie(buf, u.cookie.load(Ordering::Relaxed));
                }
                u.sock.send(buf).await.map(|_| None)
            }
            DgramSock::Icmp(s) => s.send(seq, buf.len()).await.map(Some),
        }
    }
    /// The next reply (None: a datagram that is not a reply to us).
    async fn recv(&self, buf: &mut [u8], foreign: &mut u64) -> std::io::Result<Rx> {
        match self {
            DgramSock::Udp(u) => {
                let n = u.sock.recv(buf).await?;
                Ok(u.classify(&buf[..n]))
            }
            DgramSock::Icmp(s) => s.recv(buf, foreign).await.map(Rx::Reply),
        }
    }
}

/// UDP_RR replies are timed in userspace (like netperf): no kernel stamp.
fn udp_reply(h: UdpHeader) -> Reply {
    Reply {
        seq: h.seq,
        rx_real_ns: None,
    }
}

/// State of the last `WINDOW` sequence numbers, for late/duplicate accounting.
const WINDOW: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum SeqState {
    Unknown,
    Pending,
    Answered,
    TimedOut,
}

/// UDP and ICMP: transactions one after the other; each waits for its reply
/// up to the timeout. Replies to older requests that arrive meanwhile are
/// counted as late (or duplicate) and reordered.
async fn dgram_loop(
    sock: &DgramSock,
    cfg: &ProbeConfig,
    req_size: u32,
    resp_size: u32,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    cancel: &mut Cancel,
) -> Result<u64> {
    let mut req = vec![b'q'; req_size as usize];
    let mut buf = vec![0u8; 65536 + 64];
    let mut states = vec![(u64::MAX, SeqState::Unknown); WINDOW];
    let mut newest_answered: Option<u64> = None;
    let mut seq: u64 = 0;
    rec.start = mono_ns();
    let stop = StopAt::new(cfg.stop, rec.start);
    let mut consecutive_errors = 0u32;
    loop {
        if stop.done(rec.counts.sent, pacer.next_start()) {
            break;
        }
        if !pacer.wait(cancel).await? || *cancel.borrow() {
            break;
        }
        seq += 1;
        if (cfg.spin || cfg.busy_poll) && seq.is_multiple_of(256) {
            tokio::task::yield_now().await;
        }
        states[(seq as usize) % WINDOW] = (seq, SeqState::Pending);
        let mut t0 = mono_ns();
        // ICMP: CLOCK_REALTIME send time, to pair with the kernel's receive stamp.
        let mut t0_real = None;
        match sock.send(&mut req, seq, resp_size).await {
            Ok(Some(SendStamp { mono_ns, real_ns })) => {
                t0 = mono_ns;
                t0_real = Some(real_ns);
            }
            Ok(None) => {}
            Err(e) => {
                rec.counts.sent += 1;
                rec.error(format!("send: {e}"));
                rec.counts.lost += 1;
                states[(seq as usize) % WINDOW].1 = SeqState::TimedOut;
                consecutive_errors += 1;
                if consecutive_errors >= 100 {
                    bail!("100 send errors in a row, last: {e}");
                }
                continue;
            }
        }
        rec.counts.sent += 1;
        let mut deadline = tokio::time::Instant::now() + cfg.timeout;
        let mut deadline_ns = t0 + cfg.timeout.as_nanos() as u64;
        let mut resent = false;
        loop {
            let r = if cfg.busy_poll {
                // Busy-poll: never sleep, so no wake-up latency lands in the sample.
                let mut i = 0u32;
                loop {
                    match sock.try_recv(&mut buf, &mut rec.counts.foreign) {
                        Ok(Some(x)) => break Ok(Ok(x)),
                        Ok(None) => {}
                        Err(e) => break Ok(Err(e)),
                    }
                    std::hint::spin_loop();
                    i = i.wrapping_add(1);
                    if i.is_multiple_of(1024) {
                        if mono_ns() > deadline_ns {
                            break Err(());
                        }
                        if *cancel.borrow() {
                            rec.counts.sent -= 1;
                            return Ok(mono_ns());
                        }
                    }
                }
            } else {
                tokio::select! {
                    r = tokio::time::timeout_at(deadline, sock.recv(&mut buf, &mut rec.counts.foreign)) => r.map_err(|_| ()),
                    _ = cancelled(cancel) => {
                        // The run ends with this transaction unanswered: do not count it.
                        rec.counts.sent -= 1;
                        return Ok(mono_ns());
                    }
                }
            };
            match r {
                Err(_) => {
                    rec.counts.lost += 1;
                    states[(seq as usize) % WINDOW].1 = SeqState::TimedOut;
                    break;
                }
                Ok(Err(e)) => {
                    // E.g. ECONNREFUSED from an ICMP port unreachable: the request is lost.
                    rec.error(format!("receive: {e}"));
                    rec.counts.lost += 1;
                    states[(seq as usize) % WINDOW].1 = SeqState::TimedOut;
                    consecutive_errors += 1;
                    if consecutive_errors >= 100 {
                        bail!("100 receive errors in a row, last: {e}");
                    }
                    // Do not spin on a dead peer: honour the pacing and a small pause.
                    tokio::time::sleep(Duration::from_millis(1).min(cfg.timeout)).await;
                    break;
                }
                Ok(Ok(Rx::Foreign)) => rec.counts.foreign += 1,
                Ok(Ok(Rx::NewCookie)) => {
                    // The server wanted a (new) cookie before a larger
                    // response: send this request once more, with it, and
                    // time the transaction from there.
                    if resent || states[(seq as usize) % WINDOW] != (seq, SeqState::Pending) {
                        rec.counts.foreign += 1;
                        continue;
                    }
                    resent = true;
                    rec.counts.cookie_refreshes += 1;
                    t0 = mono_ns();
                    if let Err(e) = sock.send(&mut req, seq, resp_size).await {
                        rec.error(format!("send: {e}"));
                        rec.counts.lost += 1;
                        states[(seq as usize) % WINDOW].1 = SeqState::TimedOut;
                        break;
                    }
                    deadline = tokio::time::Instant::now() + cfg.timeout;
                    deadline_ns = t0 + cfg.timeout.as_nanos() as u64;
                }
                Ok(Ok(Rx::Reply(Reply {
                    seq: got,
                    rx_real_ns,
                }))) => {
                    let t1 = mono_ns();
                    rec.seq = got;
                    let slot = &mut states[(got as usize) % WINDOW];
                    if slot.0 != got {
                        // Older than the window, or never sent.
                        rec.counts.foreign += 1;
                        continue;
                    }
                    match slot.1 {
                        SeqState::Pending => {
                            debug_assert_eq!(got, seq);
                            slot.1 = SeqState::Answered;
                            consecutive_errors = 0;
                            match t0_real {
                                // UDP_RR: userspace times, as netperf.
                                None => rec.sample(t0, t1),
                                // ICMP: the kernel's receive time, as ping.
                                Some(sent) => match rx_real_ns
                                    .and_then(|rx| super::icmp::kernel_rtt(sent, rx, t1 - t0))
                                {
                                    Some(rtt) => rec.sample_rtt(t0, rtt),
                                    None => {
                                        rec.counts.rx_timestamp_fallbacks += 1;
                                        rec.sample(t0, t1);
                                    }
                                },
                            }
                            newest_answered = Some(got);
                            break;
                        }
                        SeqState::Answered => rec.counts.duplicates += 1,
                        SeqState::TimedOut => {
                            slot.1 = SeqState::Answered;
                            rec.counts.late += 1;
                            if newest_answered.is_some_and(|n| got < n) {
                                rec.counts.reordered += 1;
                            }
                        }
                        SeqState::Unknown => rec.counts.foreign += 1,
                    }
                }
            }
        }
    }
    let end = mono_ns();
    // Collect stragglers (late replies, duplicates) for a short while without
    // holding up the result: up to 10 ms, never more than the timeout.
    let grace = Duration::from_millis(10).min(cfg.timeout);
    let until = tokio::time::Instant::now() + grace;
    while let Ok(Ok(rx)) =
        tokio::time::timeout_at(until, sock.recv(&mut buf, &mut rec.counts.foreign)).await
    {
        let Rx::Reply(Reply { seq: got, .. }) = rx else {
            continue;
        };
        let slot = &mut states[(got as usize) % WINDOW];
        if slot.0 != got {
            continue;
        }
        match slot.1 {
            SeqState::Answered => rec.counts.duplicates += 1,
            SeqState::TimedOut => {
                slot.1 = SeqState::Answered;
                rec.counts.late += 1;
                if newest_answered.is_some_and(|n| got < n) {
                    rec.counts.reordered += 1;
                }
            }
            _ => {}
        }
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::active::cancel::cancel_pair;
    use crate::active::serve;

    /// In-process, no privileges: serve on 127.0.0.1 (port 0) and probe it.
    #[test]
    fn in_process_probe_against_in_process_serve() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cfg = serve::ServeConfig {
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                ..Default::default()
            };
            let server = serve::bind(cfg).await.unwrap();
            let port = server.local_addrs()[0].port();
            let (stop_srv, srv_cancel) = cancel_pair();
            let srv = tokio::spawn(server.run(srv_cancel));
            for (kind, io) in [
                (Kind::TcpRr, IoMode::BlockingThread),
                (Kind::TcpRr, IoMode::TokioReactor),
                (Kind::UdpRr, IoMode::TokioReactor),
            ] {
                let mut c = ProbeConfig::new(kind, "127.0.0.1");
                c.port = port;
                c.io = io;
                c.stop = Stop::Count(200);
                c.req_size = 10;
                c.resp_size = 300;
                let (_keep, cancel) = cancel_pair();
                let r = run_probe(&c, cancel).await.unwrap();
                assert_eq!(r.counts.received, 200, "{kind:?} {io:?}: {:?}", r.counts);
                assert_eq!(r.samples.len(), 200);
                let s = r.summary;
                assert!(s.min <= s.p50 && s.p50 <= s.p99 && s.p99 <= s.max, "{s:?}");
                assert_eq!(r.settings.count, Some(200));
                assert_eq!(r.settings.resp_size, 300);
                // Samples are in send order, offsets increasing.
                assert!(r.samples.windows(2).all(|w| w[0].0 < w[1].0));
            }
            // Cancelling a long run returns promptly with what was measured.
            for io in [IoMode::BlockingThread, IoMode::TokioReactor] {
                let mut c = ProbeConfig::new(Kind::TcpRr, "127.0.0.1");
                c.port = port;
                c.io = io;
                c.stop = Stop::Duration(Duration::from_secs(60));
                c.interval = Duration::from_millis(5);
                let (tx, cancel) = cancel_pair();
                let t = std::time::Instant::now();
                let h = tokio::spawn(async move { run_probe(&c, cancel).await });
                tokio::time::sleep(Duration::from_millis(300)).await;
                tx.send(true).unwrap();
                let r = h.await.unwrap().unwrap();
                assert!(
                    t.elapsed() < Duration::from_secs(3),
                    "{io:?}: cancel took {:?}",
                    t.elapsed()
                );
                assert!(r.counts.received > 10, "{io:?}: {:?}", r.counts);
                assert_eq!(r.counts.sent, r.counts.received);
            }
            stop_srv.send(true).unwrap();
            srv.await.unwrap().unwrap();
        });
    }

    /// UDP accounting against a misbehaving responder whose behaviour per
    /// sequence number the test decides: every 5th request answered twice,
    /// every 7th answered 100 ms late (after the 30 ms timeout), every 11th
    /// not at all; the counts must come out exactly.
    #[test]
    fn udp_counts_late_duplicate_lost_exactly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let srv = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let port = srv.local_addr().unwrap().port();
            let srv = std::sync::Arc::new(srv);
            let s2 = srv.clone();
            let responder = tokio::spawn(async move {
                let mut buf = vec![0u8; 2048];
                loop {
                    let (n, peer) = s2.recv_from(&mut buf).await.unwrap();
                    let h = UdpHeader::decode(&buf[..n]).unwrap();
                    let reply = buf[..h.resp as usize].to_vec();
                    let seq = h.seq;
                    if seq.is_multiple_of(11) {
                        continue;
                    }
                    if seq.is_multiple_of(7) {
                        let s3 = s2.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            let _ = s3.send_to(&reply, peer).await;
                        });
                        continue;
                    }
                    s2.send_to(&reply, peer).await.unwrap();
                    if seq.is_multiple_of(5) {
                        s2.send_to(&reply, peer).await.unwrap();
                    }
                }
            });
            let mut c = ProbeConfig::new(Kind::UdpRr, "127.0.0.1");
            c.port = port;
            c.stop = Stop::Count(40);
            c.timeout = Duration::from_millis(30);
            c.interval = Duration::from_millis(40);
            let (_keep, cancel) = cancel_pair();
            let r = run_probe(&c, cancel).await.unwrap();
            responder.abort();
            let seqs = 1..=40u64;
            let dropped = seqs.clone().filter(|s| s % 11 == 0).count() as u64;
            let delayed = seqs.clone().filter(|s| s % 7 == 0 && s % 11 != 0).count() as u64;
            let dups = seqs
                .clone()
                .filter(|s| s % 5 == 0 && s % 7 != 0 && s % 11 != 0)
                .count() as u64;
            let k = &r.counts;
            assert_eq!(k.sent, 40, "{k:?}");
            assert_eq!(k.lost, dropped + delayed, "{k:?}");
            assert_eq!(k.received, 40 - dropped - delayed, "{k:?}");
            // A late reply (100 ms) arrives two or three transactions later
            // (40 ms interval): late, and older than the newest reply. The
            // last delayed one (seq 35) arrives while seq 37 or 38 waits.
            assert_eq!(k.late, delayed, "{k:?}");
            assert_eq!(k.reordered, delayed, "{k:?}");
            assert_eq!(k.duplicates, dups, "{k:?}");
            assert_eq!(r.samples.len() as u64, k.received);
        });
    }

    /// Transactions/s divide by `-l` (netperf), not by first send -> last reply.
    #[test]
    fn in_flight_at_the_end_of_the_run_ends_with_it() {
        let now = mono_ns();
        let hour = 3_600_000_000_000u64;
        assert_eq!(in_flight_verdict(0, now - 1, 1), InFlight::Waiting);
        // -l over, a transaction in flight: it ends with the run, even before its -W.
        assert_eq!(in_flight_verdict(now, now - 1, hour), InFlight::Ended);
        // Within -l: -W decides.
        assert_eq!(
            in_flight_verdict(now - 2_000, now + hour, 1_000),
            InFlight::TimedOut
        );
        assert_eq!(in_flight_verdict(now, now + hour, hour), InFlight::Waiting);
    }

    #[test]
    fn throughput_divides_by_the_run_length() {
        let l = Duration::from_secs(2);
        // A run that reached its end: -l, whatever the span of its transactions.
        assert_eq!(run_length(Stop::Duration(l), 200, false, 1.9901), 2.0);
        // Cancelled: only as long as it ran.
        assert_eq!(run_length(Stop::Duration(l), 50, true, 0.5), 0.5);
        // A count: the time it took.
        assert_eq!(run_length(Stop::Count(300), 300, false, 0.02), 0.02);
        // ping -c with -w: the deadline if it came first, else the time taken.
        assert_eq!(run_length(Stop::CountOrDuration(5, l), 3, false, 1.99), 2.0);
        assert_eq!(
            run_length(Stop::CountOrDuration(5, l), 5, false, 0.04),
            0.04
        );
    }

    #[test]
    fn pacer_keeps_the_grid() {
        let mut c = ProbeConfig::new(Kind::UdpRr, "x");
        c.interval = Duration::from_millis(10);
        c.burst = 2;
        c.io = IoMode::BlockingThread;
        c.kind = Kind::TcpRr;
        let mut p = Pacer::new(&c).unwrap();
        // First burst: starts now, the next one 10 ms later.
        assert_eq!(p.plan(), None);
        let first_next = p.next;
        assert_eq!(p.plan(), None, "second transaction of the burst");
        assert_eq!(p.plan(), Some(first_next), "next burst waits for the grid");
        // Late by less than an interval: the grid is kept.
        p.in_burst = 0;
        p.next = mono_ns() - 3_000_000;
        let late = p.next;
        assert_eq!(p.plan(), None);
        assert_eq!(p.next, late + 10_000_000);
        // Late by more than an interval: the grid restarts from now.
        p.in_burst = 0;
        p.next = mono_ns() - 50_000_000;
        let before = mono_ns();
        assert_eq!(p.plan(), None);
        assert!(p.next >= before + 10_000_000);
    }
}
