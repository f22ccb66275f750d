//! ICMP echo: the socket (unprivileged datagram ICMP where allowed, raw
//! otherwise) and the packet codec.
//!
//! Datagram ICMP sockets (`SOCK_DGRAM`, `IPPROTO_ICMP`/`IPPROTO_ICMPV6`) need
//! the caller's group in `net.ipv4.ping_group_range`; the kernel then owns the
//! echo identifier (it is the socket's "port") and delivers only our replies.
//! Raw sockets need CAP_NET_RAW and see every ICMP packet of the namespace, so
//! replies are matched on type, identifier and a per-run cookie in the payload.
//!
//! Payload: 8-byte cookie (random per run), 8-byte sequence number (the 16-bit
//! ICMP sequence wraps; this one does not), then padding up to the size asked.
//!
//! Timing, as ping does it: the socket has SO_TIMESTAMPNS on, so every reply
//! comes with the kernel's receive time (CLOCK_REALTIME, taken when the packet
//! entered the stack) in a control message; the request's send time is a
//! CLOCK_REALTIME reading taken immediately before `sendto()`. The process's
//! own wake-up and scheduling latency is then not in the RTT.
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Smallest echo payload: cookie + sequence.
pub const MIN_PAYLOAD: usize = 16;
/// ping's default payload size.
pub const DEFAULT_PAYLOAD: usize = 56;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpSocketKind {
    Dgram,
    Raw,
}

impl IcmpSocketKind {
    pub fn name(self) -> &'static str {
        match self {
            IcmpSocketKind::Dgram => "dgram",
            IcmpSocketKind::Raw => "raw",
        }
    }
}

/// What `settings.clock` says when the kernel's receive timestamps were used.
pub const CLOCK_KERNEL_RX: &str = "kernel rx timestamp (SO_TIMESTAMPNS), realtime send stamp";
/// What `settings.clock` says when they were not (no reply carried one).
pub const CLOCK_USERSPACE: &str = "userspace monotonic";

/// When a request left: both clocks, read immediately before `sendto()`.
#[derive(Debug, Clone, Copy)]
pub struct SendStamp {
    /// CLOCK_MONOTONIC, ns: pacing, timeouts, the sample's offset from the start.
    pub mono_ns: u64,
    /// CLOCK_REALTIME, ns: the same clock as the kernel's receive timestamp.
    pub real_ns: u64,
}

/// One of our echo replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub seq: u64,
    /// The kernel's receive time (CLOCK_REALTIME, ns), when a
    /// SCM_TIMESTAMPNS control message came with the reply.
    pub rx_real_ns: Option<u64>,
}

/// CLOCK_REALTIME in nanoseconds.
pub fn real_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The RTT from the kernel's receive timestamp, if it is consistent with the
/// userspace bounds: the reply cannot have arrived before the request left,
/// nor after the process saw it (`user_rtt_ns`, on CLOCK_MONOTONIC). A
/// CLOCK_REALTIME step between send and receive (NTP, settimeofday) breaks
/// one of the two; the caller then falls back to the userspace time.
pub fn kernel_rtt(send_real_ns: u64, rx_real_ns: u64, user_rtt_ns: u64) -> Option<u64> {
    let rtt = rx_real_ns.checked_sub(send_real_ns)?;
    (rtt <= user_rtt_ns).then_some(rtt)
}

pub struct IcmpSocket {
    fd: AsyncFd<Socket>,
    pub kind: IcmpSocketKind,
    /// SO_TIMESTAMPNS is on: replies should carry the kernel's receive time.
    pub rx_timestamps: bool,
    v6: bool,
    dest: SockAddr,
    id: u16,
    cookie: u64,
}

impl IcmpSocket {
    /// Open a datagram ICMP socket, or a raw one if that is refused.
    pub fn open(target: IpAddr) -> io::Result<Self> {
        let (domain, proto) = match target {
            IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
            IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
        };
        let (sock, kind) = match Socket::new(domain, Type::DGRAM, Some(proto)) {
            Ok(s) => (s, IcmpSocketKind::Dgram),
            Err(e) => {
                tracing::debug!("datagram ICMP socket refused ({e}); trying a raw socket");
                let s = Socket::new(domain, Type::RAW, Some(proto)).map_err(|e2| {
                    io::Error::new(
                        e2.kind(),
                        format!(
                            "no ICMP socket: datagram refused ({e}; see net.ipv4.ping_group_range), raw refused ({e2}; needs CAP_NET_RAW)"
                        ),
                    )
                })?;
                (s, IcmpSocketKind::Raw)
            }
        };
        sock.set_nonblocking(true)?;
        // Same option for datagram and raw, IPv4 and IPv6 (SOL_SOCKET level).
        let rx_timestamps = match setsockopt(&sock, sockopt::ReceiveTimestampns, &true) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("SO_TIMESTAMPNS refused ({e}); ICMP RTTs will be userspace times");
                false
            }
        };
        let dest = SockAddr::from(SocketAddr::new(target, 0));
        Ok(IcmpSocket {
            // SAFETY: the socket stays open for as long as the AsyncFd owns it.
            fd: unsafe { AsyncFd::register(sock) }.map_err(io::Error::from)?,
            kind,
            rx_timestamps,
            v6: target.is_ipv6(),
            dest,
            id: rand::random(),
            cookie: rand::random(),
        })
    }

    /// The echo identifier on the wire: a datagram socket's is the "port" the kernel bound it
    /// to (it rewrites the field), a raw socket's is the one it writes.
    pub fn identifier(&self) -> Option<u16> {
        match self.kind {
            IcmpSocketKind::Raw => Some(self.id),
            IcmpSocketKind::Dgram => self
                .fd
                .get_ref()
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .map(|a| a.port()),
        }
    }

    /// Build and send echo request `seq` with `payload` bytes of payload.
    /// Returns the send time, read on both clocks immediately before `sendto()`
    /// (again on each retry, should the socket not be writable at once).
    pub async fn send(&self, seq: u64, payload: usize) -> io::Result<SendStamp> {
        let pkt = encode_echo(self.v6, self.id, seq, self.cookie, payload);
        let dest = &self.dest;
        self.fd
            .async_io(Interest::WRITABLE, |s| {
                let mono_ns = crate::sys::clock::mono_ns();
                let real_ns = real_ns();
                s.send_to(&pkt, dest)
                    .map(|_| SendStamp { mono_ns, real_ns })
            })
            .await
    }

    /// One non-blocking `recvmsg()`: the datagram's length and the kernel's
    /// receive timestamp, if a SCM_TIMESTAMPNS control message came with it.
    fn recv_stamped(&self, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
        // Room for one timespec message and a spare one.
        let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec, nix::sys::time::TimeSpec);
        let mut iov = [IoSliceMut::new(buf)];
        let m = recvmsg::<()>(
            self.fd.get_ref().as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_DONTWAIT,
        )
        .map_err(io::Error::from)?;
        let mut stamp = None;
        if let Ok(cmsgs) = m.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmTimestampns(ts) = c {
                    if ts.tv_sec() > 0 && ts.tv_nsec() >= 0 {
                        stamp = Some(ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64);
                    }
                }
            }
        }
        Ok((m.bytes, stamp))
    }

    /// One non-blocking receive straight to the syscall (busy polling).
    /// Ok(None): nothing there; Ok(Some(None)): a packet that is not our reply.
    pub fn try_recv(&self, buf: &mut [u8], foreign: &mut u64) -> io::Result<Option<Option<Reply>>> {
        match self.recv_stamped(buf) {
            Ok((n, rx_real_ns)) => {
                let r = self.decode(&buf[..n]);
                if r.is_none() {
                    *foreign += 1;
                }
                Ok(Some(r.map(|seq| Reply { seq, rx_real_ns })))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn decode(&self, b: &[u8]) -> Option<u64> {
        let id = match self.kind {
            IcmpSocketKind::Raw => Some(self.id),
            IcmpSocketKind::Dgram => None,
        };
        let ip_header = self.kind == IcmpSocketKind::Raw && !self.v6;
        decode_echo_reply(b, self.v6, ip_header, id, self.cookie)
    }

    /// Receive until one of our echo replies arrives.
    /// Packets that are not our replies are skipped (counted in `foreign`).
    pub async fn recv(&self, buf: &mut [u8], foreign: &mut u64) -> io::Result<Reply> {
        loop {
            let (n, rx_real_ns) = self
                .fd
                .async_io(Interest::READABLE, |_| self.recv_stamped(buf))
                .await?;
            match self.decode(&buf[..n]) {
                Some(seq) => return Ok(Reply { seq, rx_real_ns }),
                None => *foreign += 1,
            }
        }
    }
}

/// The Internet checksum (RFC 1071).
pub fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in b.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += w as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request: type, code, checksum (IPv4 only; the kernel fills it for
/// ICMPv6), identifier, 16-bit sequence, payload (cookie, seq, padding).
pub fn encode_echo(v6: bool, id: u16, seq: u64, cookie: u64, payload: usize) -> Vec<u8> {
    let payload = payload.max(MIN_PAYLOAD);
    let mut p = vec![0u8; 8 + payload];
    p[0] = if v6 { 128 } else { 8 };
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6..8].copy_from_slice(&(seq as u16).to_be_bytes());
    p[8..16].copy_from_slice(&cookie.to_be_bytes());
    p[16..24].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in p[24..].iter_mut().enumerate() {
        *b = (i & 0xff) as u8;
    }
    if !v6 {
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
    }
    p
}

/// Our echo reply's sequence number, or None for anything else. `ip_header`:
/// the buffer starts with an IPv4 header (raw IPv4 sockets). `id`: the
/// identifier to require (raw sockets; datagram sockets are filtered by the kernel).
pub fn decode_echo_reply(
    b: &[u8],
    v6: bool,
    ip_header: bool,
    id: Option<u16>,
    cookie: u64,
) -> Option<u64> {
    let b = if ip_header {
        let ihl = (*b.first()? & 0x0f) as usize * 4;
        if ihl < 20 {
            return None;
        }
        b.get(ihl..)?
    } else {
        b
    };
    if b.len() < 8 + MIN_PAYLOAD {
        return None;
    }
    let want_type = if v6 { 129 } else { 0 };
    if b[0] != want_type || b[1] != 0 {
        return None;
    }
    if let Some(id) = id {
        if u16::from_be_bytes([b[4], b[5]]) != id {
            return None;
        }
    }
    if u64::from_be_bytes(b[8..16].try_into().ok()?) != cookie {
        return None;
    }
    let seq = u64::from_be_bytes(b[16..24].try_into().ok()?);
    if seq as u16 != u16::from_be_bytes([b[6], b[7]]) {
        return None;
    }
    Some(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_request_verifies() {
        let p = encode_echo(false, 0x1234, 7, 99, 56);
        assert_eq!(p.len(), 64);
        assert_eq!(checksum(&p), 0, "a packet with its checksum sums to zero");
        assert_eq!(checksum(&[0x45, 0x00, 0x00, 0x1c]), !(0x451c_u16));
    }

    #[test]
    fn reply_roundtrip() {
        let mut p = encode_echo(false, 5, 300, 42, 20);
        p[0] = 0; // the peer turns a request into a reply
        assert_eq!(decode_echo_reply(&p, false, false, Some(5), 42), Some(300));
        assert_eq!(decode_echo_reply(&p, false, false, Some(6), 42), None);
        assert_eq!(decode_echo_reply(&p, false, false, None, 43), None);
        // Our own request seen on a raw socket is not a reply.
        let req = encode_echo(false, 5, 300, 42, 20);
        assert_eq!(decode_echo_reply(&req, false, false, Some(5), 42), None);
        // With an IPv4 header in front.
        let mut ip = vec![0x45u8; 20];
        ip.extend_from_slice(&p);
        assert_eq!(decode_echo_reply(&ip, false, true, Some(5), 42), Some(300));
        assert_eq!(decode_echo_reply(&ip[..30], false, true, Some(5), 42), None);
        assert_eq!(decode_echo_reply(&[], false, true, None, 42), None);
        let mut r6 = encode_echo(true, 5, 1, 42, 16);
        r6[0] = 129;
        assert_eq!(decode_echo_reply(&r6, true, false, None, 42), Some(1));
    }

    #[test]
    fn kernel_rtt_must_fit_the_userspace_bounds() {
        let t = 1_700_000_000_000_000_000u64;
        // Kernel stamp 20 us after the send, process saw it 70 us after.
        assert_eq!(kernel_rtt(t, t + 20_000, 70_000), Some(20_000));
        assert_eq!(kernel_rtt(t, t + 70_000, 70_000), Some(70_000));
        // Realtime stepped back or forward between send and receive.
        assert_eq!(kernel_rtt(t, t - 1, 70_000), None);
        assert_eq!(kernel_rtt(t, t + 70_001, 70_000), None);
    }

    #[test]
    fn realtime_is_epoch_nanoseconds() {
        let sys = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(real_ns().abs_diff(sys) < 1_000_000_000);
    }
}
