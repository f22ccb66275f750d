//! `probe tcp-connect`: each request is a TCP handshake (tcping, `hping3 -S`, netperf's TCP_CC).
//! A non-blocking `connect()` is timed from just before the call to the moment the socket is
//! writable, which the kernel signals when the SYN-ACK came and its ACK left (or the handshake
//! failed). The socket is then closed at once: a FIN, never a byte of data. No responder is
//! needed, any open port answers: the path where ICMP is filtered can still be measured.
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::active::cancel::{cancelled, Cancel};
use crate::active::engine::{Event, Reply, Sent, Stamp, Transport};
use crate::sys::clock::mono_ns;

/// A handshake in flight.
struct Pending {
    sock: AsyncFd<Socket>,
    seq: u64,
    deadline: tokio::time::Instant,
}

/// Handshakes to one address, one at a time.
pub(crate) struct Connect {
    addr: SocketAddr,
    timeout: Duration,
    cancel: Cancel,
    pending: Option<Pending>,
    /// SYNs sent again by the kernel (its retransmission timer: 1 s, then 2 s, ...), summed over
    /// every handshake, from `tcpi_total_retrans` of each socket before it is closed.
    pub syn_retransmits: u64,
    /// Handshakes answered by a reset (ECONNREFUSED: nothing listens on the port).
    pub refused: u64,
}

impl Connect {
    pub fn new(addr: SocketAddr, timeout: Duration, cancel: Cancel) -> Self {
        Connect {
            addr,
            timeout,
            cancel,
            pending: None,
            syn_retransmits: 0,
            refused: 0,
        }
    }

    /// Close the handshake in flight (if any), counting its SYN retransmissions.
    pub fn close(&mut self) {
        if let Some(p) = self.pending.take() {
            if let Ok(info) = crate::sys::tcpinfo::tcp_info(p.sock.get_ref()) {
                self.syn_retransmits += u64::from(info.tcpi_total_retrans);
            }
        }
    }

    /// The socket is writable: the handshake completed, or failed.
    fn finished(&mut self, t1: u64) -> Event {
        let Some(p) = &self.pending else {
            return Event::TimedOut;
        };
        let seq = p.seq;
        match p.sock.get_ref().take_error() {
            Ok(None) => {
                self.close();
                Event::Reply(
                    Reply {
                        seq,
                        rx_real_ns: None,
                        ttl: None,
                    },
                    t1,
                )
            }
            Ok(Some(e)) | Err(e) => {
                if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                    self.refused += 1;
                }
                self.close();
                Event::Failed(e)
            }
        }
    }
}

/// A non-blocking TCP socket for `addr`, its `connect()` started; the time just before the call.
fn start(addr: SocketAddr) -> std::io::Result<(Socket, u64)> {
    let s = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    let t0 = mono_ns();
    match s.connect(&addr.into()) {
        Ok(()) => Ok((s, t0)),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok((s, t0)),
        Err(e) => Err(e),
    }
}

impl Transport for Connect {
    async fn send(&mut self, seq: u64) -> Result<Sent> {
        self.close();
        let (s, t0) = match start(self.addr) {
            Ok(v) => v,
            Err(e) => return Ok(Sent::Failed(e)),
        };
        // SAFETY: the socket stays open for as long as the AsyncFd holds it.
        let sock = unsafe { AsyncFd::register(s) }.map_err(std::io::Error::from)?;
        self.pending = Some(Pending {
            sock,
            seq,
            deadline: tokio::time::Instant::now() + self.timeout,
        });
        Ok(Sent::At(Stamp {
            mono_ns: t0,
            real_ns: None,
        }))
    }

    async fn recv(&mut self) -> Result<Event> {
        let Some(p) = &self.pending else {
            return Ok(Event::TimedOut);
        };
        let mut cancel = self.cancel.clone();
        let woke = tokio::select! {
            r = p.sock.writable() => {
                let t1 = mono_ns();
                drop(r?);
                Woke::Writable(t1)
            }
            _ = tokio::time::sleep_until(p.deadline) => Woke::Deadline,
            _ = cancelled(&mut cancel) => Woke::Cancelled,
        };
        Ok(match woke {
            Woke::Writable(t1) => self.finished(t1),
            Woke::Deadline => {
                self.close();
                Event::TimedOut
            }
            Woke::Cancelled => Event::Stopped,
        })
    }
}

/// What ended the wait for a handshake.
enum Woke {
    /// The socket became writable at this time (CLOCK_MONOTONIC).
    Writable(u64),
    Deadline,
    Cancelled,
}

impl Drop for Connect {
    fn drop(&mut self) {
        self.close();
    }
}
