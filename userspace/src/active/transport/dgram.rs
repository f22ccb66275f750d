//! UDP_RR and ICMP echo: one datagram per request, replies matched by the
//! sequence number they carry; a reply not received within the timeout is
//! lost (and counted late if it comes afterwards). The reply is waited for
//! in the reactor, or busy-polled with non-blocking receives (`--busy-poll`).
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::UdpSocket;

use super::sys_io;
use crate::active::cancel::{cancelled, Cancel};
use crate::active::engine::{Event, Reply, Sent, Stamp, Transport};
use crate::active::framing::{
    carried_cookie, cookie_request, decode_cookie, write_cookie, UdpHeader,
};
use crate::active::icmp::IcmpSocket;
use crate::sys::clock::mono_ns;

/// What a receive brought.
pub(crate) enum Rx {
    Reply(Reply),
    /// UDP: the server sent a new cookie instead of the response.
    NewCookie,
    /// Not a reply to us.
    Foreign,
    /// ICMP: an error about one of our requests.
    IcmpError(crate::active::icmp::IcmpError),
}

/// A datagram socket: UDP to `rttscope serve`, or ICMP echo.
pub(crate) trait Datagrams {
    /// Send request `seq` (in `req`, whose length is the request size).
    async fn send(&mut self, req: &mut [u8], seq: u64) -> std::io::Result<Stamp>;
    /// The next datagram, in the reactor.
    async fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<Rx>;
    /// One non-blocking receive straight to the syscall. Ok(None): nothing there.
    fn try_recv(&mut self, buf: &mut [u8]) -> std::io::Result<Option<Rx>>;
    /// Datagrams skipped as not ours inside `recv`/`try_recv`.
    fn foreign(&self) -> u64 {
        0
    }
}

/// The datagram transport over a [`Datagrams`] socket.
pub(crate) struct Dgram<S> {
    pub sock: S,
    req: Vec<u8>,
    buf: Vec<u8>,
    timeout: Duration,
    busy_poll: bool,
    cancel: Cancel,
    deadline: tokio::time::Instant,
    deadline_ns: u64,
}

impl<S: Datagrams> Dgram<S> {
    pub fn new(sock: S, req_size: u32, timeout: Duration, busy_poll: bool, cancel: Cancel) -> Self {
        Dgram {
            sock,
            req: vec![b'q'; req_size as usize],
            buf: vec![0u8; 65536 + 64],
            timeout,
            busy_poll,
            cancel,
            deadline: tokio::time::Instant::now(),
            deadline_ns: 0,
        }
    }

    /// Busy-poll: never sleep, so no wake-up latency lands in the sample.
    fn poll(&mut self) -> Event {
        let mut i = 0u32;
        loop {
            match self.sock.try_recv(&mut self.buf) {
                Ok(Some(rx)) => return event(rx),
                Ok(None) => {}
                Err(e) => return Event::Failed(e),
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i.is_multiple_of(1024) {
                if mono_ns() > self.deadline_ns {
                    return Event::TimedOut;
                }
                if *self.cancel.borrow() {
                    return Event::Stopped;
                }
            }
        }
    }
}

fn event(rx: Rx) -> Event {
    match rx {
        Rx::Reply(r) => Event::Reply(r, mono_ns()),
        Rx::NewCookie => Event::Resend,
        Rx::Foreign => Event::Foreign,
        Rx::IcmpError(e) => Event::IcmpError(e),
    }
}

impl<S: Datagrams> Transport for Dgram<S> {
    async fn send(&mut self, seq: u64) -> Result<Sent> {
        match self.sock.send(&mut self.req, seq).await {
            Ok(stamp) => {
                self.deadline = tokio::time::Instant::now() + self.timeout;
                self.deadline_ns = stamp.mono_ns + self.timeout.as_nanos() as u64;
                Ok(Sent::At(stamp))
            }
            Err(e) => Ok(Sent::Failed(e)),
        }
    }

    async fn recv(&mut self) -> Result<Event> {
        if self.busy_poll {
            return Ok(self.poll());
        }
        tokio::select! {
            r = tokio::time::timeout_at(self.deadline, self.sock.recv(&mut self.buf)) => Ok(match r {
                Err(_) => Event::TimedOut,
                Ok(Err(e)) => Event::Failed(e),
                Ok(Ok(rx)) => event(rx),
            }),
            _ = cancelled(&mut self.cancel) => Ok(Event::Stopped),
        }
    }

    async fn pause(&mut self) {
        tokio::time::sleep(Duration::from_millis(1).min(self.timeout)).await;
    }

    async fn straggler(&mut self, until: tokio::time::Instant) -> Option<Reply> {
        loop {
            match tokio::time::timeout_at(until, self.sock.recv(&mut self.buf)).await {
                Ok(Ok(Rx::Reply(r))) => return Some(r),
                Ok(Ok(_)) => {}
                _ => return None,
            }
        }
    }

    fn foreign(&self) -> u64 {
        self.sock.foreign()
    }
}

/// A UDP_RR socket and, when responses are larger than requests, the
/// server's cookie (see `framing.rs`).
pub(crate) struct UdpPeer {
    sock: UdpSocket,
    /// The size responses ask for.
    resp: u32,
    /// Responses are larger than requests: requests carry the cookie.
    cookie_mode: bool,
    cookie: Option<u64>,
}

impl UdpPeer {
    /// Bind, connect to `addr` and, for responses larger than requests, get a cookie.
    pub async fn connect(
        addr: SocketAddr,
        req: u32,
        resp: u32,
        timeout: Duration,
        cancel: &mut Cancel,
    ) -> Result<Self> {
        let bind: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let sock = UdpSocket::bind(bind)
            .await
            .context("binding a UDP socket")?;
        sock.connect(addr)
            .await
            .with_context(|| format!("connecting UDP to {addr}"))?;
        let mut peer = UdpPeer {
            sock,
            resp,
            cookie_mode: resp > req,
            cookie: None,
        };
        if peer.cookie_mode {
            peer.handshake(timeout, cancel).await;
        }
        Ok(peer)
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.sock.local_addr().ok()
    }

    /// Before the clock starts: ask for a cookie, up to three times, each
    /// waiting up to the reply timeout. Without one the run still starts (an
    /// older server answers without); a server that wants one answers the
    /// first request with a cookie and the request is sent again.
    async fn handshake(&mut self, timeout: Duration, cancel: &mut Cancel) {
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
                            if matches!(self.classify(n, &buf), Rx::NewCookie) {
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

    /// Classify the `n` bytes received in `buf`; take the cookie from a cookie datagram or
    /// from bytes 16..24 of a response (the server's current one).
    fn classify(&mut self, n: usize, buf: &[u8]) -> Rx {
        let d = &buf[..n];
        if let Ok(h) = UdpHeader::decode(d) {
            if self.cookie_mode {
                if let Some(c) = carried_cookie(d) {
                    self.cookie = Some(c);
                }
            }
            // UDP_RR replies are timed in userspace (like netperf): no kernel stamp.
            return Rx::Reply(Reply {
                seq: h.seq,
                rx_real_ns: None,
                ttl: None,
            });
        }
        match decode_cookie(d) {
            Some(c) if self.cookie_mode => {
                self.cookie = Some(c);
                Rx::NewCookie
            }
            _ => Rx::Foreign,
        }
    }
}

impl Datagrams for UdpPeer {
    /// Timed from just before the header is written (as netperf, userspace times).
    async fn send(&mut self, req: &mut [u8], seq: u64) -> std::io::Result<Stamp> {
        let mono_ns = mono_ns();
        UdpHeader {
            resp: self.resp,
            seq,
        }
        .write(req);
        if let (true, Some(c)) = (self.cookie_mode, self.cookie) {
            write_cookie(req, c);
        }
        self.sock.send(req).await?;
        Ok(Stamp {
            mono_ns,
            real_ns: None,
        })
    }

    async fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<Rx> {
        let n = self.sock.recv(buf).await?;
        Ok(self.classify(n, buf))
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> std::io::Result<Option<Rx>> {
        // SAFETY: recv into a buffer we own, of its length.
        let r = sys_io(unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        });
        match r {
            Ok(n) => Ok(Some(self.classify(n, buf))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// An ICMP reply or error as the engine takes it.
fn icmp_rx(r: crate::active::icmp::Received) -> Rx {
    match r {
        crate::active::icmp::Received::Reply(r) => Rx::Reply(Reply {
            seq: r.seq,
            rx_real_ns: r.rx_real_ns,
            ttl: r.ttl,
        }),
        crate::active::icmp::Received::Error(e) => Rx::IcmpError(e),
    }
}

/// ICMP echo: the RTT from the kernel's receive stamp (see `icmp.rs`).
pub(crate) struct Icmp {
    pub sock: IcmpSocket,
    foreign: u64,
}

impl Icmp {
    pub fn new(sock: IcmpSocket) -> Self {
        Icmp { sock, foreign: 0 }
    }
}

impl Datagrams for Icmp {
    /// The send time on both clocks, read immediately before `sendto()`.
    async fn send(&mut self, req: &mut [u8], seq: u64) -> std::io::Result<Stamp> {
        let s = self.sock.send(seq, req.len()).await?;
        Ok(Stamp {
            mono_ns: s.mono_ns,
            real_ns: Some(s.real_ns),
        })
    }

    async fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<Rx> {
        Ok(icmp_rx(self.sock.recv(buf, &mut self.foreign).await?))
    }

    fn try_recv(&mut self, buf: &mut [u8]) -> std::io::Result<Option<Rx>> {
        // A packet that is not ours is counted in `foreign` (once) and polling goes on.
        Ok(self
            .sock
            .try_recv(buf, &mut self.foreign)?
            .and_then(|r| r.map(icmp_rx)))
    }

    fn foreign(&self) -> u64 {
        self.foreign
    }
}
