//! `probe tcp-connect`: each request is a TCP handshake (tcping, `hping3 -S`, netperf's TCP_CC).
//! A non-blocking `connect()` is started and waited on until the socket is writable, which the
//! kernel signals when the SYN-ACK came and its ACK left (or the handshake failed). The RTT is the
//! kernel's own SYN to SYN-ACK time (`tcpi_rtt`: the handshake's one sample, taken in softirq when
//! the SYN-ACK is processed), as ping takes the kernel's receive stamp: waking the probe late on a
//! busy host (1-4 ms seen at CI's load on 2 cores) does not count. A handshake whose SYN was sent
//! again gives the kernel no sample from the first SYN (Karn): it is timed in userspace, from
//! just before `connect()` to writable, so that the retransmission timer's second counts, as in
//! tcping. The socket is then closed at once: a FIN, never a byte of data. No responder is
//! needed, any open port answers: the path where ICMP is filtered can still be measured.
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;

use crate::active::cancel::{cancelled, Cancel};
use crate::active::engine::{Event, Reply, Sent, Stamp, Transport};
use crate::sys::clock::mono_ns;

/// `settings.clock` of a tcp-connect result.
pub(crate) const CLOCK: &str =
    "tcpi_rtt (kernel: SYN to SYN-ACK); CLOCK_MONOTONIC connect() to writable if a SYN was resent";

/// A handshake in flight.
struct Pending {
    sock: AsyncFd<Socket>,
    seq: u64,
    /// Just before `connect()` (CLOCK_MONOTONIC).
    t0: u64,
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
    /// Completed handshakes timed in userspace (connect() to writable) because the kernel had
    /// no sample of the first SYN (it was sent again, or `tcpi_rtt` read 0).
    pub timed_in_userspace: u64,
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
            timed_in_userspace: 0,
        }
    }

    /// Close the handshake in flight (if any), counting its SYN retransmissions; the kernel's
    /// `tcp_info` of it (read once: the retransmissions and the handshake's RTT).
    pub fn close(&mut self) -> Option<libc::tcp_info> {
        let p = self.pending.take()?;
        let info = crate::sys::tcpinfo::tcp_info(p.sock.get_ref()).ok()?;
        self.syn_retransmits += u64::from(info.tcpi_total_retrans);
        Some(info)
    }

    /// The socket is writable: the handshake completed, or failed, or the kernel gave up on it.
    fn finished(&mut self, t1: u64) -> Event {
        let Some(p) = &self.pending else {
            return Event::TimedOut;
        };
        let (seq, t0) = (p.seq, p.t0);
        let end = classify(p.sock.get_ref().take_error());
        let kernel = self.close();
        match end {
            Handshake::Connected => {
                let t1 = match kernel.and_then(|i| handshake_rtt_ns(&i)) {
                    Some(rtt) => t0 + rtt,
                    None => {
                        self.timed_in_userspace += 1;
                        t1
                    }
                };
                let reply = Reply {
                    seq,
                    rx_real_ns: None,
                    ttl: None,
                };
                Event::Reply(reply, t1)
            }
            Handshake::TimedOut => Event::TimedOut,
            Handshake::Refused(e) => {
                self.refused += 1;
                Event::Failed(e)
            }
            Handshake::Failed(e) => Event::Failed(e),
        }
    }
}

/// The kernel's SYN to SYN-ACK time of a connected socket: its srtt holds that one sample
/// (`tcp_rcv_synsent_state_process` runs `tcp_ack` on the SYN-ACK; the first sample sets srtt to
/// it). None when a SYN was sent again: the sample, if any, is of the last SYN (from the
/// timestamp echo), not of the handshake the application waited for.
fn handshake_rtt_ns(info: &libc::tcp_info) -> Option<u64> {
    (info.tcpi_total_retrans == 0 && info.tcpi_rtt > 0).then(|| u64::from(info.tcpi_rtt) * 1000)
}

/// How a handshake ended, from the socket's pending error (`SO_ERROR`, `take_error`).
#[derive(Debug)]
enum Handshake {
    Connected,
    /// ETIMEDOUT: the kernel sent its last SYN (`net.ipv4.tcp_syn_retries`) and got no answer
    /// before rttscope's own `-W` did. No answer is a timeout (ping's, netperf's, irtt's word),
    /// whichever clock ran out first: counted lost, not an error.
    TimedOut,
    /// ECONNREFUSED: a reset answered (nothing listens): an error, and counted as refused.
    Refused(std::io::Error),
    /// Any other error (no route, host unreachable from an ICMP error, ...): an error, with its reason.
    Failed(std::io::Error),
}

fn classify(so_error: std::io::Result<Option<std::io::Error>>) -> Handshake {
    match so_error {
        Ok(None) => Handshake::Connected,
        Ok(Some(e)) | Err(e) => match e.raw_os_error() {
            Some(libc::ETIMEDOUT) => Handshake::TimedOut,
            Some(libc::ECONNREFUSED) => Handshake::Refused(e),
            _ => Handshake::Failed(e),
        },
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
            t0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Error;

    #[test]
    fn the_kernels_syn_timeout_is_a_timeout_other_errors_stay_errors() {
        let os = |n| Ok(Some(Error::from_raw_os_error(n)));
        assert!(matches!(classify(Ok(None)), Handshake::Connected));
        assert!(matches!(classify(os(libc::ETIMEDOUT)), Handshake::TimedOut));
        // getsockopt(SO_ERROR) itself failing with ETIMEDOUT says the same.
        let failed = classify(Err(Error::from_raw_os_error(libc::ETIMEDOUT)));
        assert!(matches!(failed, Handshake::TimedOut));
        match classify(os(libc::ECONNREFUSED)) {
            Handshake::Refused(e) => assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED)),
            other => panic!("ECONNREFUSED: {other:?}"),
        }
        for n in [
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::ECONNRESET,
            libc::EACCES,
        ] {
            match classify(os(n)) {
                Handshake::Failed(e) => assert_eq!(e.raw_os_error(), Some(n), "{e}"),
                other => panic!("errno {n}: {other:?}"),
            }
        }
        // An error without an errno (no kernel reason) stays an error.
        assert!(matches!(
            classify(Ok(Some(Error::other("?")))),
            Handshake::Failed(_)
        ));
    }

    #[test]
    fn the_kernels_sample_is_taken_only_from_an_unrepeated_syn() {
        // SAFETY: tcp_info is integers only: zeros are a valid value.
        let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
        assert_eq!(handshake_rtt_ns(&i), None, "no sample (srtt 0)");
        i.tcpi_rtt = 20_344;
        assert_eq!(handshake_rtt_ns(&i), Some(20_344_000));
        i.tcpi_total_retrans = 1;
        assert_eq!(handshake_rtt_ns(&i), None, "the SYN was sent again");
    }

    /// The real kernel over loopback: a completed handshake is timed by the kernel (not counted
    /// as timed in userspace), and its RTT is within the span userspace saw around it.
    #[test]
    fn a_loopback_handshake_is_timed_by_the_kernel() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (_keep, cancel) = crate::active::cancel::cancel_pair();
        let mut c = Connect::new(addr, Duration::from_secs(10), cancel);
        let (sent, ev, after) = rt.block_on(async {
            let sent = match c.send(1).await.unwrap() {
                Sent::At(s) => s.mono_ns,
                other => panic!("{other:?}"),
            };
            let ev = c.recv().await.unwrap();
            (sent, ev, mono_ns())
        });
        let Event::Reply(r, t1) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(r.seq, 1);
        assert_eq!(c.timed_in_userspace, 0);
        assert!(
            t1 > sent && t1 <= after,
            "sent {sent} reply {t1} after {after}"
        );
    }

    /// The real kernel: SYNs to a full accept queue go unanswered; with TCP_USER_TIMEOUT 300 ms
    /// the kernel gives up (ETIMEDOUT) at its first retransmission timer, 1 s, well before this
    /// run's own 10 s deadline: a timeout, not an error nor a refusal.
    #[test]
    fn a_handshake_the_kernel_gives_up_on_is_timed_out() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let full = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        full.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        full.listen(0).unwrap();
        let addr = full.local_addr().unwrap().as_socket().unwrap();
        // Backlog 0 holds one: this fills it, and the kernel drops the next SYNs.
        let _filler = std::net::TcpStream::connect(addr).unwrap();
        let (_keep, cancel) = crate::active::cancel::cancel_pair();
        let mut c = Connect::new(addr, Duration::from_secs(10), cancel);
        let t0 = std::time::Instant::now();
        let ev = rt.block_on(async {
            let (s, t0) = start(addr).unwrap();
            s.set_tcp_user_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            c.pending = Some(Pending {
                // SAFETY: the socket stays open for as long as the AsyncFd holds it.
                sock: unsafe { AsyncFd::register(s) }.unwrap(),
                seq: 1,
                t0,
                deadline: tokio::time::Instant::now() + c.timeout,
            });
            c.recv().await.unwrap()
        });
        let waited = t0.elapsed();
        assert!(matches!(ev, Event::TimedOut), "{waited:?}");
        assert!(
            waited < Duration::from_secs(5),
            "the kernel gave up after {waited:?}"
        );
        assert_eq!(c.refused, 0);
    }
}
