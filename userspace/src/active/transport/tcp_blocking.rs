//! TCP_RR on a dedicated blocking thread (the default): the socket is switched
//! to blocking mode, and every transaction is one send() and as many recv()
//! as the response needs, exactly like netperf and the bare loop
//! (`--busy-poll`: non-blocking recv() in a loop). No SO_RCVTIMEO (it would
//! arm a kernel timer on every blocking recv): cancellation and the
//! transaction timeout come from a watchdog that shuts the socket down.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::tcp::{in_flight_verdict, watchdog_period, InFlight, TcpConn};
use crate::active::cancel::{cancelled, Cancel};
use crate::active::config::ProbeConfig;
use crate::active::engine::{
    self, Event, Pacer, Plan, Recorder, Reply, Sent, Signal, Stamp, Transport,
};
use crate::sys::clock::mono_ns;

/// What the probe thread and its watchdog share.
struct Flags {
    /// Cancelled, or the end of `-l` with a transaction in flight.
    stop: Arc<AtomicBool>,
    /// The transaction in flight is older than the timeout.
    timed_out: AtomicBool,
    /// The in-flight transaction's start (0: none).
    inflight: AtomicU64,
}

/// The transport of the probe thread.
struct Blocking {
    sock: Arc<TcpStream>,
    req: Vec<u8>,
    resp: Vec<u8>,
    flags: Arc<Flags>,
    addr: SocketAddr,
    timeout: Duration,
    busy_poll: bool,
    seq: u64,
    t0: u64,
}

impl Blocking {
    /// How a failed read or write ends the run: stopped, over the timeout, or broken.
    fn ended(&self, what: &str, e: Option<std::io::Error>) -> Result<Event> {
        if self.flags.stop.load(Relaxed) {
            // Cancelled mid-transaction: it does not count.
            return Ok(Event::Stopped);
        }
        if self.flags.timed_out.load(Relaxed) {
            return self.took_too_long();
        }
        match e {
            Some(e) => Err(e).context(format!(
                "TCP transaction {} with {}: {what}",
                self.seq, self.addr
            )),
            None => bail!(
                "TCP transaction {} with {}: the responder closed the connection",
                self.seq,
                self.addr
            ),
        }
    }
    fn took_too_long(&self) -> Result<Event> {
        bail!(
            "TCP transaction {} with {} took longer than {:?}",
            self.seq,
            self.addr,
            self.timeout
        )
    }
}

impl Transport for Blocking {
    async fn send(&mut self, seq: u64) -> Result<Sent> {
        self.seq = seq;
        self.t0 = mono_ns();
        self.flags.inflight.store(self.t0, Relaxed);
        let mut s: &TcpStream = &self.sock;
        if let Err(e) = s.write_all(&self.req) {
            return self
                .ended("sending a request", Some(e))
                .map(|_| Sent::Stopped);
        }
        Ok(Sent::At(Stamp {
            mono_ns: self.t0,
            real_ns: None,
        }))
    }

    async fn recv(&mut self) -> Result<Event> {
        let mut s: &TcpStream = &self.sock;
        let mut got = 0;
        while got < self.resp.len() {
            match s.read(&mut self.resp[got..]) {
                Ok(0) => return self.ended("receiving a response", None),
                Ok(n) => got += n,
                Err(e) if self.busy_poll && e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop();
                    if self.flags.stop.load(Relaxed) {
                        return Ok(Event::Stopped);
                    }
                    if mono_ns() - self.t0 > self.timeout.as_nanos() as u64 {
                        return self.took_too_long();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return self.ended("receiving a response", Some(e)),
            }
        }
        // Stamped before the stop is looked at: the watchdog sets it before it shuts the socket
        // down, so a reply read after that shutdown (its FIN already on the wire: the response
        // was queued, the thread slow to read it) does not count, and one that counts ended
        // before the FIN left.
        let t1 = mono_ns();
        self.flags.inflight.store(0, Relaxed);
        if self.flags.stop.load(SeqCst) {
            return Ok(Event::Stopped);
        }
        Ok(Event::Reply(
            Reply {
                seq: self.seq,
                rx_real_ns: None,
                ttl: None,
            },
            t1,
        ))
    }
}

/// Run the transactions of `plan` on a blocking thread, its watchdog in this task.
pub(crate) async fn run(
    conn: TcpConn,
    addr: SocketAddr,
    cfg: &ProbeConfig,
    mut plan: Plan,
    mut rec: Recorder,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    // A thread of its own: nothing to yield to.
    plan.yield_often = false;
    let s = conn.s.into_std().context("detaching the socket")?;
    // --busy-poll polls the reply: non-blocking reads in a loop. Otherwise
    // (also with --spin, which spins only the pacing wait) plain blocking calls.
    s.set_nonblocking(cfg.busy_poll)?;
    s.set_write_timeout(Some(cfg.timeout))?;
    let flags = Arc::new(Flags {
        stop: Arc::new(AtomicBool::new(false)),
        timed_out: AtomicBool::new(false),
        inflight: AtomicU64::new(0),
    });
    let mut pacer = Pacer::new(
        cfg.interval,
        cfg.burst,
        cfg.spin,
        Signal::Flag(flags.stop.clone()),
    )?;
    // Shared so the descriptor stays open until both sides are done with it.
    let sock = Arc::new(s);
    let mut t = Blocking {
        sock: sock.clone(),
        req: conn.req,
        resp: conn.resp,
        flags: flags.clone(),
        addr,
        timeout: cfg.timeout,
        busy_poll: cfg.busy_poll,
        seq: 0,
        t0: 0,
    };
    let handle = tokio::task::spawn_blocking(move || -> Result<(Recorder, u64)> {
        // SAFETY: prctl on the calling thread only.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        let end = engine::block_on(engine::run(&mut t, &mut pacer, &mut rec, &plan))?;
        Ok((rec, end))
    });
    let r = watch(handle, &sock, &flags, cfg, cancel).await;
    drop(sock);
    r
}

/// The watchdog: on cancel, or a transaction older than the timeout, shut
/// the socket down; the blocked recv() returns and the thread ends.
async fn watch(
    mut handle: tokio::task::JoinHandle<Result<(Recorder, u64)>>,
    sock: &TcpStream,
    flags: &Flags,
    cfg: &ProbeConfig,
    cancel: &mut Cancel,
) -> Result<(Recorder, u64)> {
    let mut tick = tokio::time::interval(watchdog_period(cfg.timeout));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let run_end = engine::StopAt::new(cfg.stop, mono_ns()).end;
    let mut fired = false;
    let r = loop {
        tokio::select! {
            r = &mut handle => break r,
            _ = cancelled(cancel), if !fired => {
                flags.stop.store(true, SeqCst);
                fired = true;
            }
            _ = tick.tick(), if !fired => {
                match in_flight_verdict(flags.inflight.load(Relaxed), run_end, timeout_ns) {
                    InFlight::Ended => flags.stop.store(true, SeqCst),
                    InFlight::TimedOut => flags.timed_out.store(true, Relaxed),
                    InFlight::Waiting => {}
                }
                fired = flags.stop.load(Relaxed) || flags.timed_out.load(Relaxed);
            }
        }
        if fired {
            // SAFETY: `sock` keeps the descriptor open.
            unsafe {
                libc::shutdown(sock.as_raw_fd(), libc::SHUT_RDWR);
            }
        }
    };
    r.context("the probe thread panicked")?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking transport on a loopback connection whose response is already queued, and
    /// the peer's end.
    fn queued_reply(stop: bool) -> (Blocking, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = TcpStream::connect(addr).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.write_all(b"ok").unwrap();
        let flags = Arc::new(Flags {
            stop: Arc::new(AtomicBool::new(stop)),
            timed_out: AtomicBool::new(false),
            inflight: AtomicU64::new(1),
        });
        let t = Blocking {
            sock: Arc::new(c),
            req: vec![b'q'],
            resp: vec![0; 2],
            flags,
            addr,
            timeout: Duration::from_secs(5),
            busy_poll: false,
            seq: 7,
            t0: mono_ns(),
        };
        (t, peer)
    }

    /// A response the thread reads after the watchdog stopped the run (and shut the socket
    /// down, its FIN on the wire) does not count, though it was queued in time: the passive
    /// views see that FIN before the reply's stamp, inside a window ending there.
    #[test]
    fn a_reply_read_after_the_stop_does_not_count() {
        let (mut t, _peer) = queued_reply(true);
        let e = engine::block_on(t.recv()).unwrap();
        assert!(matches!(e, Event::Stopped), "{e:?}");
        let (mut t, _peer) = queued_reply(false);
        let e = engine::block_on(t.recv()).unwrap();
        assert!(matches!(e, Event::Reply(r, _) if r.seq == 7), "{e:?}");
        assert_eq!(t.flags.inflight.load(Relaxed), 0);
    }
}
