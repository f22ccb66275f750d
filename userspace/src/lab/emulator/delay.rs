//! The delay emulator: a thread in the router namespace that holds each queued packet (its id,
//! no payload) until it is due, then issues the ACCEPT verdict; its counters.
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::Rng;
use serde::Serialize;

use super::link::Direction;
use crate::analysis::stats::hdr_percentile;
use crate::lab::nfqueue::{NfQueue, QueuedPacket, NFQA_CFG_F_GSO, NF_ACCEPT, NF_DROP};

/// SCHED_FIFO priority of the emulator thread.
pub const RT_PRIORITY: i32 = 10;
/// Default bound of packets held per direction.
pub const DEFAULT_MAX_HELD: usize = 20_000;

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
            late_p50_us: hdr_percentile(&h, 50.0),
            late_p99_us: hdr_percentile(&h, 99.0),
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

#[cfg(test)]
mod tests {
    use super::*;

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
