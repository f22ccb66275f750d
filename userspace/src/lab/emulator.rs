//! Link impairment on the lab's router: delay + jitter, random loss, and a
//! bottleneck rate with a queue limit, per direction, changeable at run time.
//!
//! The kernel here has no `netem` (KERNEL.md), so:
//!
//! - **Delay and jitter** come from our own emulator: rules in the router
//!   namespace's mangle FORWARD chain send each direction's forwarded
//!   packets to its own NFQUEUE (`-j NFQUEUE --queue-num N --queue-bypass`;
//!   iptables, because this kernel lacks the nftables `queue` expression,
//!   CONFIG_NFT_QUEUE, but has the xtables target); a thread of this process, which has
//!   `setns()`'d into the router namespace, receives each packet's id
//!   (metadata only, no payload copy) and issues the ACCEPT verdict when the
//!   packet is due. `bypass` means that if the emulator is gone (crash), the
//!   kernel accepts the packets instead of dropping them: the link loses its
//!   delay but never black-holes. We do *not* set fail-open: when the
//!   kernel's queue is full, packets are dropped (as a real bounded queue
//!   would) and counted by the kernel (`queue_dropped`).
//! - Packet order is kept when jitter is 0 (each release time is at least the
//!   previous one, also across a delay decrease); with jitter, packets are
//!   released in due order and may be reordered, as with netem.
//! - The emulator holds at most `max_held` packets per direction; a packet
//!   arriving at a full queue is dropped at once and counted (`dropped_full`).
//! - **Loss**: `numgen random mod 10000 < pct*100 counter drop` in our
//!   nftables table `inet rttscope_lab` at forward priority -200, before the
//!   queue rules at -150 (drops are counted by the rule).
//! - **Bottleneck**: `tbf rate R burst B limit L` as the root qdisc of the
//!   router's egress interface of that direction; a deep `limit` makes a
//!   standing queue (bufferbloat).
//!
//! Why a thread and not a child process: run-time changes (the rtt-step
//! scenario) are a store into shared state, statistics are read directly,
//! and the thread dies with the process, after which `bypass` keeps the
//! link up until the testbed is removed.
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::Rng;
use serde::Serialize;

use super::nfqueue::{NfQueue, QueuedPacket, NFQA_CFG_F_GSO, NF_ACCEPT, NF_DROP};
use super::testbed::{self, Role, Testbed, RTR_CLI_IF, RTR_SRV_IF};

/// The nftables table the lab owns inside the router namespace.
pub const NFT_TABLE: &str = "rttscope_lab";
/// SCHED_FIFO priority of the emulator thread.
pub const RT_PRIORITY: i32 = 10;
/// Default bound of packets held per direction.
pub const DEFAULT_MAX_HELD: usize = 20_000;

/// A direction through the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// client -> server
    Up,
    /// server -> client
    Down,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Up, Direction::Down];

    fn idx(self) -> usize {
        match self {
            Direction::Up => 0,
            Direction::Down => 1,
        }
    }
    /// Router interface the direction's packets arrive on.
    pub fn ingress_if(self) -> &'static str {
        match self {
            Direction::Up => RTR_CLI_IF,
            Direction::Down => RTR_SRV_IF,
        }
    }
    /// Router interface the direction's packets leave by (where tbf goes).
    pub fn egress_if(self) -> &'static str {
        match self {
            Direction::Up => RTR_SRV_IF,
            Direction::Down => RTR_CLI_IF,
        }
    }
}

/// One direction's impairment. `Default` is a clean link.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LinkConfig {
    /// Added one-way delay.
    #[serde(serialize_with = "ser_us", rename = "delay_us")]
    pub delay: Duration,
    /// Jitter: each packet's delay is `delay` plus uniform in [-jitter, +jitter] (floored at 0).
    #[serde(serialize_with = "ser_us", rename = "jitter_us")]
    pub jitter: Duration,
    /// Random loss in percent (0..=100), resolution 0.01 %.
    pub loss_pct: f64,
    /// Bottleneck rate in bits per second (None: unlimited).
    pub rate_bps: Option<u64>,
    /// Bottleneck queue limit in bytes (tbf `limit`; only with a rate). Default 64 KiB.
    #[serde(rename = "queue_limit_bytes")]
    pub queue_limit: Option<u64>,
}

fn ser_us<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

impl LinkConfig {
    pub fn delay(d: Duration) -> Self {
        LinkConfig {
            delay: d,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<()> {
        if !(0.0..=100.0).contains(&self.loss_pct) || self.loss_pct.is_nan() {
            bail!(
                "loss must be between 0 and 100 percent, not {}",
                self.loss_pct
            );
        }
        if self.delay > Duration::from_secs(10) || self.jitter > Duration::from_secs(10) {
            bail!("delay and jitter are limited to 10 s");
        }
        if let Some(r) = self.rate_bps {
            if r < 8_000 {
                bail!("a bottleneck rate below 8 kbit/s is not supported ({r} bit/s)");
            }
        }
        if self.queue_limit.is_some() && self.rate_bps.is_none() {
            bail!("a queue limit needs a bottleneck rate");
        }
        Ok(())
    }

    fn needs_queue(&self) -> bool {
        !self.delay.is_zero() || !self.jitter.is_zero()
    }
}

/// Counters of one direction of the delay emulator.
#[derive(Debug, Default)]
struct DirCounters {
    received: AtomicU64,
    released: AtomicU64,
    dropped_full: AtomicU64,
    held: AtomicU64,
    max_held: AtomicU64,
}

/// A snapshot of one direction's counters.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DirStats {
    /// Packets the emulator received from the kernel queue.
    pub received: u64,
    /// Packets released (ACCEPT verdict).
    pub released: u64,
    /// Packets dropped because `max_held` packets were already held.
    pub dropped_full: u64,
    /// Packets held right now.
    pub held: u64,
    /// Most packets held at once.
    pub max_held: u64,
}

/// Emulator-wide counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EmulatorStats {
    pub up: DirStats,
    pub down: DirStats,
    /// Malformed netlink messages skipped.
    pub bad_messages: u64,
    /// Whether the emulator thread got real-time priority (SCHED_FIFO).
    pub realtime: bool,
    /// CPU time the emulator thread has used (user + system), microseconds.
    pub cpu_us: u64,
    /// Packets whose arrival time came from the kernel's queue timestamp
    /// (the others were stamped when the emulator read them).
    pub kernel_stamped: u64,
    /// Lateness of releases (actual verdict time - due time), microseconds.
    pub late_p50_us: u64,
    pub late_p99_us: u64,
    pub late_max_us: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct DelayCfg {
    delay: Duration,
    jitter: Duration,
}

struct Shared {
    stop: AtomicBool,
    cpu_ns: AtomicU64,
    realtime: AtomicBool,
    stamped: AtomicU64,
    cfg: Mutex<[DelayCfg; 2]>,
    counters: [DirCounters; 2],
    bad: AtomicU64,
    late: Mutex<hdrhistogram::Histogram<u64>>,
}

#[derive(PartialEq, Eq)]
struct Held {
    due: Instant,
    seq: u64,
    pkt: (u16, u32),
}

impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // BinaryHeap is a max-heap: reverse for earliest first.
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Shared {
    fn new() -> Shared {
        Shared {
            stop: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
            realtime: AtomicBool::new(false),
            stamped: AtomicU64::new(0),
            cfg: Mutex::new([DelayCfg::default(); 2]),
            counters: Default::default(),
            bad: AtomicU64::new(0),
            late: Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()),
        }
    }
}

/// In the emulator thread: enter `netns`, ask for a 1 us timer slack and
/// real-time priority, keep receive timestamps on, and bind the queues.
fn open_queues(
    netns: Option<&Path>,
    queues: [u16; 2],
    max_held: usize,
    sh: &Shared,
) -> Result<(NfQueue, Option<std::os::fd::OwnedFd>)> {
    if let Some(p) = netns {
        crate::sys::netns::enter_path(p, &p.to_string_lossy())?;
    }
    // Timer slack 1 us: release times are honoured to the microsecond, not 50 us.
    // SAFETY: prctl on the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    // Real-time priority (best effort): on a busy machine a
    // normal thread can wait 10+ ms for a CPU, which would be
    // added to packets' delay. The loop sleeps in ppoll, and the
    // kernel's RT throttling keeps 5 % of each CPU for others.
    let param = libc::sched_param {
        sched_priority: RT_PRIORITY,
    };
    // SAFETY: pthread_self is the calling thread; param is valid.
    let rt =
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) } == 0;
    sh.realtime.store(rt, Ordering::Relaxed);
    let stamps = enable_rx_timestamps();
    let mut q = NfQueue::open().context("opening an NFQUEUE netlink socket")?;
    for qn in queues {
        q.bind(qn, (max_held + 1024) as u32, NFQA_CFG_F_GSO)
            .with_context(|| format!("binding NFQUEUE {qn}"))?;
    }
    Ok((q, stamps))
}

/// The delay emulator: one thread, one netlink socket bound to two queues.
pub struct DelayEmulator {
    pub queues: [u16; 2],
    pub max_held: usize,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl DelayEmulator {
    /// Start the emulator in the namespace at `netns` (None: the current
    /// one), bound to `queues` = [up, down]. The queues are bound before
    /// this returns, so steering rules may be installed right after.
    pub fn start(netns: Option<PathBuf>, queues: [u16; 2], max_held: usize) -> Result<Self> {
        let shared = Arc::new(Shared::new());
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("lab-emulator".into())
            .spawn(move || {
                let q = open_queues(netns.as_deref(), queues, max_held, &sh);
                match q {
                    Ok((q, _stamps)) => {
                        let _ = tx.send(Ok(()));
                        emulate(q, queues, max_held, &sh)
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        Ok(())
                    }
                }
            })
            .context("starting the emulator thread")?;
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(DelayEmulator {
                queues,
                max_held,
                shared,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => bail!("the delay emulator did not start within 5 s"),
        }
    }

    /// Change one direction's delay and jitter (takes effect for packets arriving from now on).
    pub fn set(&self, dir: Direction, delay: Duration, jitter: Duration) {
        self.shared.cfg.lock().unwrap()[dir.idx()] = DelayCfg { delay, jitter };
    }

    pub fn stats(&self) -> EmulatorStats {
        let snap = |c: &DirCounters| DirStats {
            received: c.received.load(Ordering::Relaxed),
            released: c.released.load(Ordering::Relaxed),
            dropped_full: c.dropped_full.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
            max_held: c.max_held.load(Ordering::Relaxed),
        };
        let h = self.shared.late.lock().unwrap();
        EmulatorStats {
            up: snap(&self.shared.counters[0]),
            down: snap(&self.shared.counters[1]),
            bad_messages: self.shared.bad.load(Ordering::Relaxed),
            realtime: self.shared.realtime.load(Ordering::Relaxed),
            kernel_stamped: self.shared.stamped.load(Ordering::Relaxed),
            cpu_us: self.shared.cpu_ns.load(Ordering::Relaxed) / 1000,
            late_p50_us: h.value_at_quantile(0.5),
            late_p99_us: h.value_at_quantile(0.99),
            late_max_us: h.max(),
        }
    }

    /// Is the emulator thread still running?
    pub fn alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stop the thread: held packets are released at once (ACCEPT).
    pub fn stop(&mut self) -> Result<()> {
        self.shared.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the delay emulator thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for DelayEmulator {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Keep the kernel's receive timestamping on while the emulator runs: a
/// socket with SO_TIMESTAMPNS enables it (a global switch that `ping` and
/// many programs turn on too), and then nfnetlink_queue sends each packet's
/// queueing time (NFQA_TIMESTAMP). Without it the emulator stamps packets
/// when it reads them. Closing the socket turns it back off.
fn enable_rx_timestamps() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket/setsockopt calls; the fd is owned at once.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        let r = libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        (r == 0).then_some(fd)
    }
}

/// CPU time of the calling thread in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The emulator loop: receive, schedule, release when due.
fn emulate(mut q: NfQueue, queues: [u16; 2], max_held: usize, sh: &Shared) -> Result<()> {
    let mut s = Schedule::new(queues, max_held);
    let mut batch: Vec<QueuedPacket> = Vec::with_capacity(1024);
    // Poll at least every 50 ms to notice `stop`.
    const IDLE: Duration = Duration::from_millis(50);
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let timeout = s
            .heap
            .peek()
            .map(|h| h.due.saturating_duration_since(now).min(IDLE))
            .unwrap_or(IDLE);
        if q.wait_readable(Some(timeout))? {
            batch.clear();
            let bad = q.recv_packets(&mut batch)?;
            sh.bad.fetch_add(bad as u64, Ordering::Relaxed);
            s.admit(&mut q, &batch, sh);
        }
        let late = s.release_due(&mut q, sh);
        q.flush_verdicts()?;
        sh.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
        if !late.is_empty() {
            let mut hist = sh.late.lock().unwrap();
            for l in late {
                let _ = hist.record(l.max(1));
            }
        }
    }
    // Stopping: release everything still held.
    while let Some(h) = s.heap.pop() {
        q.push_verdict(
            QueuedPacket {
                queue: h.pkt.0,
                id: h.pkt.1,
                tstamp_us: None,
            },
            NF_ACCEPT,
        );
    }
    q.flush_verdicts()?;
    Ok(())
}

/// The packets held by the emulator loop, by release time, and per direction
/// how many are held and the latest release time given.
struct Schedule {
    queues: [u16; 2],
    max_held: usize,
    heap: BinaryHeap<Held>,
    last_due: [Instant; 2],
    counts: [usize; 2],
    seq: u64,
    rng: rand::rngs::ThreadRng,
}

impl Schedule {
    fn new(queues: [u16; 2], max_held: usize) -> Schedule {
        Schedule {
            queues,
            max_held,
            heap: BinaryHeap::new(),
            last_due: [Instant::now(); 2],
            counts: [0usize; 2],
            seq: 0,
            rng: rand::thread_rng(),
        }
    }

    /// Hold each packet of `batch` until its due time (dropped when its
    /// direction already holds `max_held`).
    fn admit(&mut self, q: &mut NfQueue, batch: &[QueuedPacket], sh: &Shared) {
        let now = Instant::now();
        let wall_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let cfg = *sh.cfg.lock().unwrap();
        for p in batch {
            let Some(d) = self.queues.iter().position(|&x| x == p.queue) else {
                // Not one of ours (cannot happen: we bound only these).
                q.push_verdict(*p, NF_ACCEPT);
                continue;
            };
            let c = &sh.counters[d];
            c.received.fetch_add(1, Ordering::Relaxed);
            if self.counts[d] >= self.max_held {
                q.push_verdict(*p, NF_DROP);
                c.dropped_full.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Arrival: the kernel's queueing time when it sent one (so the
            // wake-up latency of this thread is not added to the delay),
            // else now. A stamp older than 100 ms or in the future is ignored.
            let arrived = match p.tstamp_us.and_then(|t| wall_us.checked_sub(t)) {
                Some(age) if age <= 100_000 => {
                    sh.stamped.fetch_add(1, Ordering::Relaxed);
                    now - Duration::from_micros(age)
                }
                _ => now,
            };
            let due = self.due(d, arrived, cfg[d]);
            self.counts[d] += 1;
            self.seq += 1;
            self.heap.push(Held {
                due,
                seq: self.seq,
                pkt: (p.queue, p.id),
            });
            c.held.store(self.counts[d] as u64, Ordering::Relaxed);
            c.max_held
                .fetch_max(self.counts[d] as u64, Ordering::Relaxed);
        }
    }

    /// When a packet of direction `d` that `arrived` is due.
    fn due(&mut self, d: usize, arrived: Instant, cfg: DelayCfg) -> Instant {
        let DelayCfg { delay, jitter } = cfg;
        let due = if jitter.is_zero() {
            // Keep order: never earlier than the previous release.
            (arrived + delay).max(self.last_due[d])
        } else {
            let j = jitter.as_nanos() as i64;
            let off = self.rng.gen_range(-j..=j);
            let base = delay.as_nanos() as i64 + off;
            arrived + Duration::from_nanos(base.max(0) as u64)
        };
        self.last_due[d] = self.last_due[d].max(due);
        due
    }

    /// Release the packets that are due; returns how late each was (us).
    fn release_due(&mut self, q: &mut NfQueue, sh: &Shared) -> Vec<u64> {
        let now = Instant::now();
        let mut late = Vec::new();
        while self.heap.peek().is_some_and(|h| h.due <= now) {
            let h = self.heap.pop().unwrap();
            let d = if h.pkt.0 == self.queues[0] { 0 } else { 1 };
            q.push_verdict(
                QueuedPacket {
                    queue: h.pkt.0,
                    id: h.pkt.1,
                    tstamp_us: None,
                },
                NF_ACCEPT,
            );
            self.counts[d] -= 1;
            let c = &sh.counters[d];
            c.released.fetch_add(1, Ordering::Relaxed);
            c.held.store(self.counts[d] as u64, Ordering::Relaxed);
            late.push(now.duration_since(h.due).as_micros() as u64);
        }
        late
    }
}

/// The nftables ruleset for both directions: random loss, at priority -200
/// (before the mangle-table queue rules at -150, so lost packets never
/// reach the emulator).
pub fn nft_ruleset(cfg: &[LinkConfig; 2]) -> String {
    let mut rules = String::new();
    for d in Direction::BOTH {
        let c = &cfg[d.idx()];
        let iif = d.ingress_if();
        let thresh = (c.loss_pct * 100.0).round() as u32;
        if thresh > 0 {
            rules.push_str(&format!(
                "    iifname \"{iif}\" numgen random mod 10000 < {thresh} counter drop comment \"loss-{d:?}\"\n"
            ));
        }
    }
    // add + delete + define in one transaction: atomic replace, also when absent.
    format!(
        "add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{\n  chain lab_forward {{\n    type filter hook forward priority -200; policy accept;\n{rules}  }}\n}}\n"
    )
}

/// The `iptables-restore` input (same for ip6tables) that steers each
/// delayed direction to its queue. This kernel has no nftables `queue`
/// expression (CONFIG_NFT_QUEUE unset) but has the xtables NFQUEUE target,
/// which iptables-nft loads through nft_compat. The router namespace is
/// ours, so the lab owns its whole mangle table.
pub fn iptables_rules(cfg: &[LinkConfig; 2], queues: [u16; 2]) -> String {
    let mut s = String::from(
        "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n",
    );
    for d in Direction::BOTH {
        if cfg[d.idx()].needs_queue() {
            s.push_str(&format!(
                "-A FORWARD -i {} -j NFQUEUE --queue-num {} --queue-bypass\n",
                d.ingress_if(),
                queues[d.idx()]
            ));
        }
    }
    s.push_str("COMMIT\n");
    s
}

/// Packets counted by the NFQUEUE rules of `iptables-save -c -t mangle`, per direction.
pub fn parse_iptables_save(text: &str, queues: [u16; 2]) -> [u64; 2] {
    let mut n = [0u64; 2];
    for line in text.lines() {
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((counts, rule)) = rest.split_once(']') else {
            continue;
        };
        let pkts: u64 = counts
            .split(':')
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        for (i, q) in queues.iter().enumerate() {
            if rule.contains(&format!("--queue-num {q} "))
                || rule.ends_with(&format!("--queue-num {q}"))
            {
                n[i] += pkts;
            }
        }
    }
    n
}

/// tbf arguments for a rate and queue limit: burst = max(2 ms at rate, 3 kB).
pub fn tbf_args(rate_bps: u64, queue_limit: Option<u64>) -> Vec<String> {
    let burst = ((rate_bps / 8) / 500).max(3028);
    let limit = queue_limit.unwrap_or(64 * 1024).max(burst);
    vec![
        "tbf".into(),
        "rate".into(),
        format!("{rate_bps}bit"),
        "burst".into(),
        burst.to_string(),
        "limit".into(),
        limit.to_string(),
    ]
}

/// What the lab changed on the router, with counters read back.
#[derive(Debug, Clone, Serialize)]
pub struct ImpairmentReport {
    pub up: LinkConfig,
    pub down: LinkConfig,
    pub emulator: EmulatorStats,
    /// Packets dropped by the random-loss rules [up, down].
    pub loss_dropped: [u64; 2],
    /// Packets sent to the delay queues [up, down] (by the nft counters).
    pub queued: [u64; 2],
}

/// All impairment of one testbed's router.
pub struct Impairment {
    rtr_ns: String,
    shut: bool,
    cfg: [LinkConfig; 2],
    emu: DelayEmulator,
}

/// NFQUEUE numbers used in the router namespace (its own netns: no clash with other testbeds).
pub const QUEUES: [u16; 2] = [10, 11];

impl Impairment {
    /// Start the emulator in the router namespace of `tb`; the link starts clean.
    pub fn new(tb: &Testbed) -> Result<Self> {
        Self::with_capacity(tb, DEFAULT_MAX_HELD)
    }

    pub fn with_capacity(tb: &Testbed, max_held: usize) -> Result<Self> {
        let emu = DelayEmulator::start(Some(tb.ns_path(Role::Rtr)), QUEUES, max_held)
            .context("starting the delay emulator in the router namespace")?;
        let mut imp = Impairment {
            rtr_ns: tb.ns(Role::Rtr),
            shut: false,
            cfg: Default::default(),
            emu,
        };
        imp.apply_nft()?;
        imp.apply_queue_rules()?;
        Ok(imp)
    }

    pub fn config(&self, dir: Direction) -> LinkConfig {
        self.cfg[dir.idx()]
    }

    /// Set one direction's impairment.
    pub fn set(&mut self, dir: Direction, c: LinkConfig) -> Result<()> {
        c.validate()?;
        let old = self.cfg[dir.idx()];
        // The emulator first, so the queue rule never points at a stale delay.
        self.emu.set(dir, c.delay, c.jitter);
        self.cfg[dir.idx()] = c;
        if old.loss_pct != c.loss_pct {
            self.apply_nft()?;
        }
        if old.needs_queue() != c.needs_queue() {
            self.apply_queue_rules()?;
        }
        if old.rate_bps != c.rate_bps || old.queue_limit != c.queue_limit {
            self.apply_tbf(dir)?;
        }
        Ok(())
    }

    /// Set both directions to the same impairment.
    pub fn set_both(&mut self, c: LinkConfig) -> Result<()> {
        self.set(Direction::Up, c)?;
        self.set(Direction::Down, c)
    }

    fn apply_nft(&mut self) -> Result<()> {
        feed(&self.rtr_ns, &["nft", "-f", "-"], &nft_ruleset(&self.cfg))
            .context("loading the loss rules into the router")
    }

    fn apply_queue_rules(&mut self) -> Result<()> {
        let rules = iptables_rules(&self.cfg, QUEUES);
        feed(&self.rtr_ns, &["iptables-restore"], &rules)
            .context("loading the delay-queue rules into the router (iptables)")?;
        feed(&self.rtr_ns, &["ip6tables-restore"], &rules)
            .context("loading the delay-queue rules into the router (ip6tables)")
    }

    fn apply_tbf(&mut self, dir: Direction) -> Result<()> {
        let c = self.cfg[dir.idx()];
        let dev = dir.egress_if();
        match c.rate_bps {
            Some(rate) => {
                let mut args: Vec<String> = ["tc", "qdisc", "replace", "dev", dev, "root"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                args.extend(tbf_args(rate, c.queue_limit));
                let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                testbed::run_in(&self.rtr_ns, &a).context("setting the bottleneck (tbf)")?;
            }
            None => {
                // Back to the default qdisc; no error if there was none of ours.
                let _ = testbed::run_in(&self.rtr_ns, &["tc", "qdisc", "del", "dev", dev, "root"]);
            }
        }
        Ok(())
    }

    /// Configuration and counters now.
    pub fn report(&self) -> ImpairmentReport {
        let (loss, queued) = self.nft_counters().unwrap_or_default();
        ImpairmentReport {
            up: self.cfg[0],
            down: self.cfg[1],
            emulator: self.emu.stats(),
            loss_dropped: loss,
            queued,
        }
    }

    pub fn emulator(&self) -> &DelayEmulator {
        &self.emu
    }

    /// Stop only the emulator thread, leaving the steering rules in place
    /// (what a crash does); `--queue-bypass` then passes packets undelayed.
    pub fn stop_emulator(&mut self) -> Result<()> {
        self.emu.stop()
    }

    /// Read the rule counters: (loss drops, queued) per direction.
    fn nft_counters(&self) -> Result<([u64; 2], [u64; 2])> {
        let out = testbed::run_in(
            &self.rtr_ns,
            &["nft", "-j", "list", "table", "inet", NFT_TABLE],
        )?;
        let loss = parse_nft_counters(&String::from_utf8_lossy(&out.stdout));
        let mut queued = [0u64; 2];
        for prog in ["iptables-save", "ip6tables-save"] {
            let out = testbed::run_in(&self.rtr_ns, &[prog, "-c", "-t", "mangle"])?;
            let q = parse_iptables_save(&String::from_utf8_lossy(&out.stdout), QUEUES);
            queued[0] += q[0];
            queued[1] += q[1];
        }
        Ok((loss, queued))
    }

    /// Stop the emulator and remove the rules and qdiscs (the testbed's
    /// namespace removal would also remove them).
    pub fn shutdown(&mut self) -> Result<()> {
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        // Emulator last: until the steering rules are gone it keeps the delay.
        let _ = testbed::run_in(&self.rtr_ns, &["nft", "delete", "table", "inet", NFT_TABLE]);
        let old = std::mem::take(&mut self.cfg);
        let _ = self.apply_queue_rules();
        for d in Direction::BOTH {
            if old[d.idx()].rate_bps.is_some() {
                let _ = testbed::run_in(
                    &self.rtr_ns,
                    &["tc", "qdisc", "del", "dev", d.egress_if(), "root"],
                );
            }
        }
        self.cfg = Default::default();
        self.emu.stop()
    }
}

impl Drop for Impairment {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Sum the `counter` packets of the rules commented `loss-Up` / `loss-Down`.
pub fn parse_nft_counters(json: &str) -> [u64; 2] {
    let mut loss = [0u64; 2];
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return loss;
    };
    for item in v["nftables"].as_array().into_iter().flatten() {
        let rule = &item["rule"];
        let Some(comment) = rule["comment"].as_str() else {
            continue;
        };
        let packets = rule["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e["counter"]["packets"].as_u64())
            .unwrap_or(0);
        match comment {
            "loss-Up" => loss[0] += packets,
            "loss-Down" => loss[1] += packets,
            _ => {}
        }
    }
    loss
}

/// Run `args` inside namespace `ns` with `input` on stdin.
fn feed(ns: &str, args: &[&str], input: &str) -> Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {} (is it installed?)", args[0]))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .with_context(|| format!("writing to {}", args[0]))?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_has_loss_and_queue_per_direction() {
        let up = LinkConfig {
            delay: Duration::from_millis(50),
            loss_pct: 2.5,
            ..Default::default()
        };
        let down = LinkConfig::default();
        let s = nft_ruleset(&[up, down]);
        assert!(
            s.contains("iifname \"rc\" numgen random mod 10000 < 250 counter drop"),
            "{s}"
        );
        assert!(
            !s.contains("iifname \"rs\""),
            "a clean direction has no rules: {s}"
        );
        assert!(s.contains("priority -200"), "{s}");
        assert!(s.starts_with("add table inet rttscope_lab\ndelete table inet rttscope_lab\n"));
        let q = iptables_rules(&[up, down], [10, 11]);
        assert!(
            q.contains("-A FORWARD -i rc -j NFQUEUE --queue-num 10 --queue-bypass\n"),
            "{q}"
        );
        assert!(!q.contains("-i rs"), "{q}");
        assert!(q.starts_with("*mangle\n") && q.ends_with("COMMIT\n"));
    }

    #[test]
    fn tbf_burst_and_limit() {
        let a = tbf_args(10_000_000, Some(1_000_000));
        assert_eq!(
            a,
            [
                "tbf",
                "rate",
                "10000000bit",
                "burst",
                "3028",
                "limit",
                "1000000"
            ]
        );
        let a = tbf_args(1_000_000_000, None);
        assert_eq!(a[4], "250000");
        assert_eq!(a[6], "250000", "limit is at least the burst");
    }

    #[test]
    fn validates() {
        assert!(LinkConfig {
            loss_pct: 101.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(LinkConfig {
            queue_limit: Some(1000),
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(LinkConfig::delay(Duration::from_millis(50))
            .validate()
            .is_ok());
    }

    #[test]
    fn parses_counters() {
        let j = r#"{"nftables":[{"metainfo":{}},{"table":{"family":"inet","name":"rttscope_lab"}},
        {"rule":{"chain":"lab_forward","comment":"loss-Up","expr":[{"match":{}},{"counter":{"packets":7,"bytes":700}},{"drop":null}]}},
        {"rule":{"chain":"lab_forward","comment":"delay-Down","expr":[{"counter":{"packets":40,"bytes":4000}},{"queue":{}}]}}]}"#;
        assert_eq!(parse_nft_counters(j), [7, 0]);
        assert_eq!(parse_nft_counters("garbage"), [0, 0]);
        let save = "*mangle\n:FORWARD ACCEPT [5:500]\n[12:1200] -A FORWARD -i rc -j NFQUEUE --queue-num 10 --queue-bypass\n[3:300] -A FORWARD -i rs -j NFQUEUE --queue-num 11 --queue-bypass\nCOMMIT\n";
        assert_eq!(parse_iptables_save(save, [10, 11]), [12, 3]);
    }

    #[test]
    fn heap_releases_earliest_first_and_fifo_on_ties() {
        let t = Instant::now();
        let mut h = BinaryHeap::new();
        h.push(Held {
            due: t + Duration::from_millis(5),
            seq: 1,
            pkt: (0, 1),
        });
        h.push(Held {
            due: t + Duration::from_millis(1),
            seq: 2,
            pkt: (0, 2),
        });
        h.push(Held {
            due: t + Duration::from_millis(1),
            seq: 3,
            pkt: (0, 3),
        });
        let order: Vec<u32> = std::iter::from_fn(|| h.pop().map(|x| x.pkt.1)).collect();
        assert_eq!(order, [2, 3, 1]);
    }
}
