//! An irtt test, in the engine's parts: the open handshake and its checks
//! ([`open_test`]), irtt's send schedule ([`Schedule`], the pacing), the
//! book of round trips that counts late and duplicate replies ([`Book`], the
//! recorder), a sender loop on this thread and a receiver loop on its own,
//! the end-of-test wait and the close.
//!
//! The timing-critical parts run on two dedicated OS threads: the sender
//! sleeps with `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` to each send
//! time (tokio's timer wheel has 1 ms granularity, too coarse for a 10 ms
//! isochronous schedule), and the receiver takes the kernel's receive
//! timestamp of each reply (`SO_TIMESTAMPNS`) and maps it onto the monotonic
//! clock. Unlike the request/response probes (`active/engine`), irtt keeps
//! sending on its schedule whatever the replies do, so its sender and
//! receiver are two loops, not one transaction at a time.
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};
use rand::RngCore;

use super::client::{
    check_params, expected_round_trips, resolve, Fill, IrttConfig, IrttReplyHook, Rejected,
};
use super::packet::{
    decode_echo_reply, encode_close, EchoLayout, EchoReply, EchoRequest, Key, MAX_PACKET,
};
use super::params::{Clock, Params};
use super::socket::{is_timeout, mono_ns, open, open_socket, recv_stamped, sleep_until_mono, Rx};
use super::stats::{RoundTrip, RunCounters, RT_LATE};

/// What a finished (or interrupted) run produced.
pub struct RawRun {
    pub local_addr: SocketAddr,
    pub remote_addr: SocketAddr,
    pub negotiated: Params,
    pub restrictions: Vec<String>,
    pub packet_length: usize,
    pub start_wall_ns: i64,
    pub duration_ns: i64,
    pub wait_ns: i64,
    pub round_trips: Vec<RoundTrip>,
    pub counters: RunCounters,
    pub rejected: Rejected,
    pub kernel_rx_stamps: u64,
    pub server_closed: bool,
    pub interrupted: bool,
    pub send_error: Option<String>,
    pub receive_error: Option<String>,
}

/// The round trips and counters the sender and the receiver share.
#[derive(Default)]
pub(super) struct Book {
    pub rts: Vec<RoundTrip>,
    pub counters: RunCounters,
    pub rejected: Rejected,
    /// The highest seqno answered so far: a reply below it is late.
    last_seqno: Option<u32>,
    pub kernel_rx_stamps: u64,
    pub server_closed: bool,
    pub receive_error: Option<String>,
}

/// What the receiver does after a reply.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Recorded (first reply to its seqno): tell the hook.
    New,
    /// Counted (duplicate, unknown seqno, rejected): nothing more.
    Counted,
}

impl Book {
    /// A reply to `reply.seqno` that arrived at `rel` (ns from the test start, monotonic).
    pub fn reply(&mut self, reply: &EchoReply, rx: &Rx, rel: i64) -> Recorded {
        let seq = reply.seqno as usize;
        if seq >= self.rts.len() {
            self.rejected.unknown_seqno += 1;
            return Recorded::Counted;
        }
        if self.rts[seq].received() {
            self.counters.duplicates += 1;
            self.rts[seq].dups = self.rts[seq].dups.saturating_add(1);
            self.counters.bytes_received += rx.len as u64;
            return Recorded::Counted;
        }
        let late = self.last_seqno.is_some_and(|l| reply.seqno < l);
        if late {
            self.counters.late += 1;
        } else {
            self.last_seqno = Some(reply.seqno);
        }
        if rx.kernel {
            self.kernel_rx_stamps += 1;
        }
        let rt = &mut self.rts[seq];
        rt.raw_rtt = (rel - rt.send_mono).max(0);
        rt.srv_recv_wall = reply.receive.wall;
        rt.srv_recv_mono = reply.receive.mono;
        rt.srv_send_wall = reply.send.wall;
        rt.srv_send_mono = reply.send.mono;
        rt.window = reply.received_window.unwrap_or(0);
        if late {
            rt.flags |= RT_LATE;
        }
        let c = &mut self.counters;
        if let Some(n) = reply.received_count {
            c.server_received_max = Some(c.server_received_max.unwrap_or(0).max(u64::from(n)));
        }
        c.bytes_received += rx.len as u64;
        c.first_recv_mono.get_or_insert(rel);
        c.last_recv_mono = rel;
        Recorded::New
    }

    /// The send at `pre`..`post` (ns from the start) failed. Some(error): the test stops.
    pub fn send_failed(&mut self, e: &std::io::Error, pre: i64, post: i64) -> Option<String> {
        let errno = e.raw_os_error().unwrap_or(0);
        if e.kind() == ErrorKind::ConnectionRefused {
            // an ICMP error from an earlier packet; this one was not sent
            self.rts.pop();
            self.rejected.icmp_errors += 1;
        } else if [libc::EPERM, libc::ENOBUFS, libc::EAGAIN].contains(&errno) {
            // dropped on this host (firewall, full queue): counted and
            // kept as a round trip lost upstream
            self.counters.send_failures += 1;
            self.counters.first_send_mono.get_or_insert(pre);
            self.counters.last_sent_mono = post;
        } else {
            self.rts.pop();
            return Some(e.to_string());
        }
        None
    }

    pub fn sent(&mut self, n: usize, pre: i64, post: i64) {
        let c = &mut self.counters;
        c.send_call.push(post - pre);
        c.bytes_sent += n as u64;
        c.first_send_mono.get_or_insert(pre);
        c.last_sent_mono = post;
    }
}

/// irtt's send schedule on a fixed grid from the test start.
pub(super) struct Schedule {
    pub interval: i64,
    pub duration: i64,
    /// At most this many packets.
    pub capacity: u64,
}

impl Schedule {
    /// The send time (ns from the start) after a send that ended at `post`,
    /// with `sent` packets sent, at `now`: the next interval boundary, or the
    /// one after if this send was already past half of its interval. None: done.
    pub fn next(&self, now: i64, post: i64, sent: u32) -> Option<i64> {
        let base = self.interval * (now / self.interval);
        let next = if post % self.interval < self.interval / 2 {
            base + self.interval
        } else {
            base + 2 * self.interval
        };
        (next < self.duration && u64::from(sent) < self.capacity).then_some(next)
    }
}

/// An opened test: the socket, the server's grant and what the packets look like.
struct Opened {
    sock: UdpSocket,
    key: Key,
    token: u64,
    layout: EchoLayout,
    run: RawRun,
}

impl Opened {
    fn close(&self) {
        if self.token != 0 {
            let _ = self.sock.send(&encode_close(self.token, &self.key));
        }
    }
}

/// Resolve, open the socket, do the handshake and check what the server granted.
fn open_test(cfg: &IrttConfig, cancel: &AtomicBool) -> Result<(Opened, bool)> {
    let remote = resolve(&cfg.server, cfg.ip_version)?;
    let sock = open_socket(cfg, remote)?;
    let local_addr = sock.local_addr()?;
    let key = cfg.hmac_key.as_deref().map(Key::new).unwrap_or_default();
    let mut rejected = Rejected::default();
    let want = cfg.requested_params();
    let opened = open(&sock, cfg, &key, &mut rejected, cancel)?;
    let got = opened.params.clone();
    let layout = EchoLayout {
        hmac: key.is_set(),
        stats: got.received_stats,
        stamp_at: got.stamp_at,
        clock: got.clock.unwrap_or(Clock::Both),
    };
    let mut o = Opened {
        sock,
        key,
        token: opened.token,
        layout,
        run: RawRun {
            local_addr,
            remote_addr: remote,
            negotiated: got.clone(),
            restrictions: Vec::new(),
            packet_length: layout.packet_len(got.length.max(0) as usize),
            start_wall_ns: crate::sys::clock::realtime_ns(),
            duration_ns: 0,
            wait_ns: 0,
            round_trips: Vec::new(),
            counters: RunCounters::default(),
            rejected,
            kernel_rx_stamps: 0,
            server_closed: opened.closed,
            interrupted: false,
            send_error: None,
            receive_error: None,
        },
    };
    o.run.restrictions = match check_params(&want, &got) {
        Ok(r) if r.is_empty() || cfg.loose => r,
        Ok(r) => {
            o.close();
            bail!(
                "the irtt server restricted the test: {}; rerun with --loose to accept",
                r.join("; ")
            );
        }
        Err(e) => {
            o.close();
            return Err(e);
        }
    };
    Ok((o, opened.closed))
}

/// Run a whole test (blocking). `cancel` stops it early; partial results are returned.
pub fn run_blocking(cfg: &IrttConfig, cancel: Arc<AtomicBool>) -> Result<RawRun> {
    cfg.validate()?;
    let (mut o, closed) = open_test(cfg, &cancel)?;
    if cfg.no_test || closed {
        if !closed {
            o.close();
        }
        return Ok(o.run);
    }
    let got = &o.run.negotiated;
    let schedule = Schedule {
        interval: got.interval_ns,
        duration: got.duration_ns,
        capacity: expected_round_trips(
            Duration::from_nanos(got.duration_ns as u64),
            Duration::from_nanos(got.interval_ns as u64),
        ),
    };
    let book = Arc::new(Mutex::new(Book {
        rts: Vec::with_capacity(schedule.capacity as usize + 1),
        rejected: std::mem::take(&mut o.run.rejected),
        ..Default::default()
    }));
    let stop_rx = Arc::new(AtomicBool::new(false));
    let start_mono = mono_ns();
    o.run.start_wall_ns = crate::sys::clock::realtime_ns();
    let receiver = Receiver {
        sock: o.sock.try_clone()?,
        book: book.clone(),
        stop: stop_rx.clone(),
        cancel: cancel.clone(),
        key: o.key.clone(),
        token: o.token,
        layout: o.layout,
        packet_length: o.run.packet_length,
        hook: cfg.on_reply.clone(),
        start_mono,
    };
    let receiver = std::thread::Builder::new()
        .name("irtt-recv".into())
        .spawn(move || receiver.run())?;
    send_all(cfg, &mut o, &schedule, &book, &cancel, start_mono);
    if !cancel.load(Ordering::Relaxed) && o.run.send_error.is_none() {
        o.run.wait_ns = wait_for_replies(cfg, &book, &cancel);
    }
    stop_rx.store(true, Ordering::Relaxed);
    let _ = receiver.join();
    o.run.duration_ns = mono_ns() - start_mono;
    finish(o, &book)
}

/// After the receiver has ended: close (unless the server did) and take the book.
fn finish(mut o: Opened, book: &Mutex<Book>) -> Result<RawRun> {
    let mut g = book.lock().unwrap();
    if !g.server_closed {
        o.close();
    }
    let run = &mut o.run;
    run.round_trips = std::mem::take(&mut g.rts);
    run.counters = std::mem::take(&mut g.counters);
    run.rejected = std::mem::take(&mut g.rejected);
    run.kernel_rx_stamps = g.kernel_rx_stamps;
    run.server_closed = g.server_closed;
    run.receive_error = g.receive_error.take();
    drop(g);
    Ok(o.run)
}

/// The payload fill of every request (or of the first, with `--fill-one`).
fn fill(cfg: &IrttConfig, req: &mut EchoRequest, rng: &mut rand::rngs::ThreadRng) {
    match &cfg.fill {
        Fill::None => {}
        Fill::Rand => rng.fill_bytes(req.payload_mut()),
        Fill::Pattern(p) if !p.is_empty() => {
            for (i, b) in req.payload_mut().iter_mut().enumerate() {
                *b = p[i % p.len()];
            }
        }
        Fill::Pattern(_) => {}
    }
}

/// The sender (this thread): a packet per send time until the duration is
/// over, cancelled, or a send fails for good. 1 ns timer slack while it runs
/// (default 50 µs), restored at the end since this may be a pooled thread.
fn send_all(
    cfg: &IrttConfig,
    o: &mut Opened,
    schedule: &Schedule,
    book: &Mutex<Book>,
    cancel: &AtomicBool,
    start_mono: i64,
) {
    // SAFETY: prctl with integer arguments only.
    let old_slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let mut req = EchoRequest::new(&o.layout, o.token, o.run.packet_length, &o.key);
    let mut rng = rand::thread_rng();
    fill(cfg, &mut req, &mut rng);
    let mut seqno: u32 = 0;
    loop {
        if cancel.load(Ordering::Relaxed) {
            o.run.interrupted = !book.lock().unwrap().server_closed;
            break;
        }
        let post = match send_one(&o.sock, req.with_seqno(seqno), book, start_mono) {
            Ok(post) => post,
            Err(e) => {
                o.run.send_error = Some(e);
                break;
            }
        };
        seqno = seqno.wrapping_add(1);
        if !cfg.fill_one {
            fill(cfg, &mut req, &mut rng);
        }
        let Some(next) = schedule.next(mono_ns() - start_mono, post, seqno) else {
            break;
        };
        sleep_until_mono(start_mono + next, cancel);
        let woke = mono_ns() - start_mono;
        if !cancel.load(Ordering::Relaxed) {
            book.lock()
                .unwrap()
                .counters
                .timer_error
                .push((woke - next).abs());
        }
    }
    if old_slack > 0 {
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, old_slack as libc::c_ulong, 0, 0, 0) };
    }
}

/// Stamp and send one packet; the end of the send call (ns from the start), or
/// the error that stops the test.
fn send_one(
    sock: &UdpSocket,
    pkt: &[u8],
    book: &Mutex<Book>,
    start_mono: i64,
) -> Result<i64, String> {
    let pre = {
        let mut g = book.lock().unwrap();
        let (m, w) = (mono_ns() - start_mono, crate::sys::clock::realtime_ns());
        g.rts.push(RoundTrip::sent(m, w));
        m
    };
    let res = sock.send(pkt);
    let post = mono_ns() - start_mono;
    let mut g = book.lock().unwrap();
    match res {
        Ok(n) => g.sent(n, pre, post),
        Err(e) => {
            if let Some(stop) = g.send_failed(&e, pre, post) {
                return Err(stop);
            }
        }
    }
    Ok(post)
}

/// Wait for outstanding replies (irtt's `--wait`); returns how long it waited.
fn wait_for_replies(cfg: &IrttConfig, book: &Mutex<Book>, cancel: &AtomicBool) -> i64 {
    let (max_rtt, mean_rtt, done) = {
        let g = book.lock().unwrap();
        let rtts: Vec<i64> = g.rts.iter().filter_map(|r| r.rtt()).collect();
        let done = rtts.len() >= g.rts.len();
        let mean = (!rtts.is_empty()).then(|| rtts.iter().sum::<i64>() as f64 / rtts.len() as f64);
        (rtts.iter().copied().max(), mean, done)
    };
    if done {
        return 0;
    }
    let w = cfg.wait.duration(max_rtt, mean_rtt);
    let t0 = mono_ns();
    let deadline = t0 + w.as_nanos().min(i64::MAX as u128 / 2) as i64;
    while mono_ns() < deadline && !cancel.load(Ordering::Relaxed) {
        {
            let g = book.lock().unwrap();
            if g.rts.iter().all(|r| r.received()) || g.server_closed {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    mono_ns() - t0
}

/// The receiver thread: decode each reply, record it, tell the hook.
struct Receiver {
    sock: UdpSocket,
    book: Arc<Mutex<Book>>,
    stop: Arc<AtomicBool>,
    cancel: Arc<AtomicBool>,
    key: Key,
    token: u64,
    layout: EchoLayout,
    packet_length: usize,
    hook: Option<IrttReplyHook>,
    start_mono: i64,
}

impl Receiver {
    fn run(self) {
        let mut buf = vec![0u8; MAX_PACKET];
        let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
        while !self.stop.load(Ordering::Relaxed) {
            let rx = match recv_stamped(&self.sock, &mut buf, &mut cmsg) {
                Ok(rx) => rx,
                Err(e) if is_timeout(&e) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    self.book.lock().unwrap().rejected.icmp_errors += 1;
                    continue;
                }
                Err(e) => {
                    self.book.lock().unwrap().receive_error = Some(e.to_string());
                    break;
                }
            };
            if !self.one(&buf[..rx.len], &rx) {
                break;
            }
        }
    }

    /// One datagram. False: the server closed the test, the receiver ends.
    fn one(&self, pkt: &[u8], rx: &Rx) -> bool {
        let decoded =
            decode_echo_reply(pkt, &self.layout, &self.key, self.token, self.packet_length);
        let mut g = self.book.lock().unwrap();
        let reply = match decoded {
            Ok(r) => r,
            Err(e) => {
                g.rejected.count(e);
                return true;
            }
        };
        if reply.closed {
            g.server_closed = true;
            self.cancel.store(true, Ordering::Relaxed);
            if reply.len < self.layout.fields_len() {
                return false;
            }
        }
        if g.reply(&reply, rx, rx.mono - self.start_mono) == Recorded::Counted {
            return true;
        }
        if let Some(h) = &self.hook {
            let seq = reply.seqno as usize;
            let cur = g.rts[seq];
            let prev = seq.checked_sub(1).map(|p| g.rts[p]);
            drop(g);
            (h.0)(reply.seqno, &cur, prev.as_ref().filter(|p| p.received()));
        }
        !reply.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rx(mono: i64) -> Rx {
        Rx {
            len: 60,
            mono,
            wall: 0,
            kernel: true,
        }
    }

    fn reply(seqno: u32) -> EchoReply {
        EchoReply {
            seqno,
            received_count: Some(seqno + 1),
            ..Default::default()
        }
    }

    /// irtt's counting: a reply below the highest answered seqno is late (and
    /// still recorded), a second reply is a duplicate, an unsent seqno is rejected.
    #[test]
    fn book_counts_late_duplicate_and_unknown_replies() {
        let mut b = Book::default();
        for i in 0..4 {
            b.rts.push(RoundTrip::sent(i * 10_000_000, 0));
        }
        assert_eq!(b.reply(&reply(0), &rx(1_000_000), 1_000_000), Recorded::New);
        assert_eq!(b.reply(&reply(2), &rx(0), 21_000_000), Recorded::New);
        // 1 arrives after 2: late, recorded with its RTT.
        assert_eq!(b.reply(&reply(1), &rx(0), 22_000_000), Recorded::New);
        assert_eq!(b.reply(&reply(2), &rx(0), 23_000_000), Recorded::Counted);
        assert_eq!(b.reply(&reply(9), &rx(0), 24_000_000), Recorded::Counted);
        let c = &b.counters;
        assert_eq!((c.late, c.duplicates, b.rejected.unknown_seqno), (1, 1, 1));
        assert_eq!(b.rts[1].raw_rtt, 12_000_000);
        assert!(b.rts[1].flags & RT_LATE != 0 && b.rts[2].flags & RT_LATE == 0);
        assert_eq!(b.rts[2].dups, 1);
        assert!(!b.rts[3].received());
        assert_eq!((c.bytes_received, b.kernel_rx_stamps), (4 * 60, 3));
        assert_eq!(c.server_received_max, Some(3));
        assert_eq!(
            (c.first_recv_mono, c.last_recv_mono),
            (Some(1_000_000), 22_000_000)
        );
    }

    #[test]
    fn schedule_keeps_irtts_grid() {
        let s = Schedule {
            interval: 10,
            duration: 100,
            capacity: 11,
        };
        // Sent early in its interval: the next boundary.
        assert_eq!(s.next(3, 3, 1), Some(10));
        // Sent past half of its interval: the one after.
        assert_eq!(s.next(16, 16, 2), Some(30));
        // The duration is over, or the capacity reached.
        assert_eq!(s.next(95, 95, 9), None);
        assert_eq!(s.next(50, 50, 11), None);
    }
}
