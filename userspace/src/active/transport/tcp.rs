//! TCP_RR: the connection and its hello, and the transport driven by the
//! tokio reactor (`--async-io`). The hot path has no per-transaction timer or
//! cancellation future: a watchdog running beside it (same task) checks the
//! in-flight transaction's age every `timeout / 4` (at most 100 ms) and on a
//! timeout or a cancel shuts the socket down, which ends the pending read.
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::sys_io;
use crate::active::cancel::{cancelled, Cancel};
use crate::active::engine::{self, Event, Pacer, Plan, Recorder, Reply, Sent, Stamp, Transport};
use crate::active::framing::{Hello, FLAG_NODELAY, HELLO_ACK};
use crate::sys::clock::mono_ns;

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

/// A connection that has said its hello, and its request and response buffers.
pub(crate) struct TcpConn {
    pub s: TcpStream,
    pub req: Vec<u8>,
    pub resp: Vec<u8>,
}

impl TcpConn {
    pub async fn connect(
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
        // The hello's answer is one round trip, which TCP's backoff can stretch as it stretches a
        // transaction (a SYN resent makes the first RTO 3 s): wait as long as for a transaction
        // (-W), and at least 5 s.
        let hello_wait = timeout.max(Duration::from_secs(5));
        let mut ack = [0u8; 4];
        match tokio::time::timeout(hello_wait, s.read_exact(&mut ack)).await {
            Ok(Ok(_)) if ack == HELLO_ACK => {}
            Ok(Ok(_)) => bail!("{addr} is not an rttscope responder (bad hello reply)"),
            Ok(Err(_)) => bail!(
                "{addr} closed the connection after the hello (sizes over its limit, or its connection limit reached; see its log)"
            ),
            Err(_) => bail!(
                "{addr} did not answer the hello within {} (the larger of -W and 5 s)",
                crate::analysis::units::fmt_duration_short(hello_wait)
            ),
        }
        Ok(TcpConn {
            s,
            req: vec![b'q'; req as usize],
            resp: vec![0u8; resp as usize],
        })
    }
}

/// What the watchdog makes of the transaction in flight (started at `inflight`, 0: none).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InFlight {
    Waiting,
    /// Older than -W: the run fails, as before.
    TimedOut,
    /// Still in flight after -l is over (TCP's backoff under loss): it ends with the run and
    /// does not count, as a transaction netperf's -l timer interrupts.
    Ended,
}

pub(crate) fn in_flight_verdict(inflight: u64, run_end: u64, timeout_ns: u64) -> InFlight {
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

/// The watchdog's tick: every `timeout / 4`, between 1 and 100 ms.
pub(crate) fn watchdog_period(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

const TIMED_OUT: u8 = 1;
const CANCELLED: u8 = 2;

/// TCP_RR in the reactor: a transaction is `write_all` then `read_exact`.
struct Reactor<'a> {
    conn: &'a mut TcpConn,
    addr: SocketAddr,
    timeout: Duration,
    busy_poll: bool,
    /// The in-flight transaction's start, for the watchdog (0: none).
    inflight: &'a AtomicU64,
    /// What the watchdog did: TIMED_OUT or CANCELLED (0: nothing).
    fired: &'a AtomicU8,
    seq: u64,
}

impl Reactor<'_> {
    /// A failed send or receive: stopped by the watchdog, over the timeout, or broken.
    fn failed(&self, e: anyhow::Error) -> Result<Event> {
        match self.fired.load(Relaxed) {
            CANCELLED => Ok(Event::Stopped),
            TIMED_OUT => self.took_too_long(),
            _ => Err(e).context(format!("TCP transaction {} with {}", self.seq, self.addr)),
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

impl Transport for Reactor<'_> {
    async fn send(&mut self, seq: u64) -> Result<Sent> {
        self.seq = seq;
        let t0 = mono_ns();
        let r = if self.busy_poll {
            send_nonblocking(self.conn)
        } else {
            self.inflight.store(t0, Relaxed);
            self.conn
                .s
                .write_all(&self.conn.req)
                .await
                .map_err(Into::into)
        };
        match r.context("sending a request") {
            Ok(()) => Ok(Sent::At(Stamp {
                mono_ns: t0,
                real_ns: None,
            })),
            Err(e) => self.failed(e).map(|_| Sent::Stopped),
        }
    }

    async fn recv(&mut self) -> Result<Event> {
        let r = if self.busy_poll {
            match recv_busy_poll(self.conn, mono_ns() + self.timeout.as_nanos() as u64) {
                Ok(false) => return self.took_too_long(),
                r => r.map(|_| ()),
            }
        } else {
            let r = self.conn.s.read_exact(&mut self.conn.resp).await;
            self.inflight.store(0, Relaxed);
            r.map(|_| ()).context("receiving a response")
        };
        let t1 = mono_ns();
        match r {
            // read after the watchdog shut the socket down (its FIN on the wire): not counted,
            // as in the blocking thread
            Ok(()) if self.fired.load(SeqCst) == CANCELLED => Ok(Event::Stopped),
            Ok(()) => Ok(Event::Reply(
                Reply {
                    seq: self.seq,
                    rx_real_ns: None,
                    ttl: None,
                },
                t1,
            )),
            Err(e) => self.failed(e),
        }
    }
}

/// Send the whole request with non-blocking send() calls (--busy-poll).
fn send_nonblocking(conn: &TcpConn) -> Result<()> {
    let fd = conn.s.as_raw_fd();
    let mut off = 0;
    while off < conn.req.len() {
        // SAFETY: send from a buffer we own, within its length.
        match sys_io(unsafe {
            libc::send(
                fd,
                conn.req[off..].as_ptr().cast(),
                conn.req.len() - off,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        }) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Busy-poll the whole response with non-blocking recv() until `deadline`
/// (CLOCK_MONOTONIC). Ok(false): the deadline passed.
fn recv_busy_poll(conn: &mut TcpConn, deadline: u64) -> Result<bool> {
    let fd = conn.s.as_raw_fd();
    let (mut got, mut i) = (0, 0u32);
    while got < conn.resp.len() {
        // SAFETY: recv into a buffer we own, within its length.
        match sys_io(unsafe {
            libc::recv(
                fd,
                conn.resp[got..].as_mut_ptr().cast(),
                conn.resp.len() - got,
                libc::MSG_DONTWAIT,
            )
        }) {
            Ok(0) => bail!("the responder closed the connection"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::hint::spin_loop();
                i = i.wrapping_add(1);
                if i.is_multiple_of(1024) && mono_ns() > deadline {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e).context("receiving a response"),
        }
    }
    Ok(true)
}

/// Run the transactions of `plan` on `conn` in the reactor, beside their watchdog.
pub(crate) async fn run(
    conn: &mut TcpConn,
    addr: SocketAddr,
    cfg: &crate::active::config::ProbeConfig,
    plan: &Plan,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    cancel: &Cancel,
) -> Result<u64> {
    let inflight = AtomicU64::new(0);
    let fired = AtomicU8::new(0);
    let fd = conn.s.as_raw_fd();
    let watchdog = watchdog(fd, cfg, &inflight, &fired, cancel.clone());
    let mut t = Reactor {
        conn,
        addr,
        timeout: cfg.timeout,
        busy_poll: cfg.busy_poll,
        inflight: &inflight,
        fired: &fired,
        seq: 0,
    };
    tokio::select! {
        biased;
        r = engine::run(&mut t, pacer, rec, plan) => r,
        _ = watchdog => unreachable!("the watchdog never completes"),
    }
}

/// On a timeout or a cancel, shut the socket down (and say which in `fired`).
async fn watchdog(
    fd: i32,
    cfg: &crate::active::config::ProbeConfig,
    inflight: &AtomicU64,
    fired: &AtomicU8,
    mut cancel: Cancel,
) {
    let timeout_ns = cfg.timeout.as_nanos() as u64;
    let run_end = engine::StopAt::new(cfg.stop, mono_ns()).end;
    let mut tick = tokio::time::interval(watchdog_period(cfg.timeout));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => match in_flight_verdict(inflight.load(Relaxed), run_end, timeout_ns) {
                InFlight::Ended => {
                    fired.store(CANCELLED, SeqCst);
                    break;
                }
                InFlight::TimedOut => {
                    fired.store(TIMED_OUT, Relaxed);
                    break;
                }
                InFlight::Waiting => {}
            },
            _ = cancelled(&mut cancel) => {
                fired.store(CANCELLED, SeqCst);
                break;
            }
        }
    }
    // SAFETY: fd belongs to the connection, which outlives this future.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
    std::future::pending::<()>().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A responder that accepts and never answers the hello (as one whose answer TCP's backoff
    /// holds back under loss): the probe waits for it as long as for a transaction (-W), not a
    /// fixed 5 s, and then fails in one sentence saying how long it waited.
    #[tokio::test]
    async fn the_hello_is_waited_for_as_long_as_a_transaction() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let held = std::thread::spawn(move || l.accept().map(|(s, _)| s));
        let t0 = std::time::Instant::now();
        let err = match TcpConn::connect(addr, 1, 1, false, Duration::from_secs(7)).await {
            Ok(_) => panic!("a responder that never answers the hello gave a connection"),
            Err(e) => e.to_string(),
        };
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_secs(7) && took < Duration::from_secs(9),
            "waited {took:?} for the hello with -W 7s: {err}"
        );
        assert_eq!(
            err,
            format!("{addr} did not answer the hello within 7s (the larger of -W and 5 s)")
        );
        drop(held.join());
    }
}
