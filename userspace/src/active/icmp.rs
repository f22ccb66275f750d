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
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{setsockopt, sockopt};

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
    /// The reply's TTL (IPv4) or hop limit (IPv6), from IP_RECVTTL / IPV6_RECVHOPLIMIT.
    pub ttl: Option<u8>,
}

/// An ICMP error about one of our echo requests (a router's or the destination's), as ping
/// reports it: `From FROM icmp_seq=SEQ TEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpError {
    /// The request's 16-bit ICMP sequence (all an error quotes of it).
    pub seq16: u16,
    /// Who sent the error.
    pub from: IpAddr,
    /// ping's words for it ("Destination Host Unreachable", "Time to live exceeded").
    pub text: String,
}

/// What the ICMP socket brought that is ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    Reply(Reply),
    Error(IcmpError),
}

/// One datagram (or error-queue message) and what came with it.
struct Datagram {
    len: usize,
    rx_real_ns: Option<u64>,
    ttl: Option<u8>,
    /// The sender's address (msg_name).
    from: Option<IpAddr>,
    /// Error queue: the ICMP type, code and info, and the offender's address.
    ext_err: Option<(u8, u8, u32, Option<IpAddr>)>,
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

/// A datagram ICMP socket for `target`'s family, or a raw one if that is refused.
fn new_socket(target: IpAddr) -> io::Result<(Socket, IcmpSocketKind)> {
    let (domain, proto) = match target {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
    };
    Ok(match Socket::new(domain, Type::DGRAM, Some(proto)) {
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
    })
}

/// Turn SO_TIMESTAMPNS on; false (with a warning) if the kernel refuses it.
fn enable_rx_timestamps(sock: &Socket) -> bool {
    // Same option for datagram and raw, IPv4 and IPv6 (SOL_SOCKET level).
    match setsockopt(sock, sockopt::ReceiveTimestampns, &true) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("SO_TIMESTAMPNS refused ({e}); ICMP RTTs will be userspace times");
            false
        }
    }
}

/// Set the requests' TTL (if given), ask for the replies' TTL and, on a datagram
/// socket, for ICMP errors on the error queue; returns whether the latter is on.
fn set_ip_options(
    sock: &Socket,
    v6: bool,
    ttl: Option<u8>,
    kind: IcmpSocketKind,
) -> io::Result<bool> {
    if let Some(ttl) = ttl {
        let (level, name) = if v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS)
        } else {
            (libc::IPPROTO_IP, libc::IP_TTL)
        };
        set_int(sock, level, name, ttl.into())?;
    }
    // The replies' TTL for `ttl=` (best effort: without it the field is left out).
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT)
    } else {
        (libc::IPPROTO_IP, libc::IP_RECVTTL)
    };
    if let Err(e) = set_int(sock, level, name, 1) {
        tracing::debug!("no TTL of replies ({e})");
    }
    let recverr = kind == IcmpSocketKind::Dgram && {
        let name = if v6 {
            libc::IPV6_RECVERR
        } else {
            libc::IP_RECVERR
        };
        set_int(sock, level, name, 1)
            .map_err(|e| tracing::debug!("no ICMP errors from the error queue ({e})"))
            .is_ok()
    };
    Ok(recverr)
}

pub struct IcmpSocket {
    fd: AsyncFd<Socket>,
    pub kind: IcmpSocketKind,
    /// SO_TIMESTAMPNS is on: replies should carry the kernel's receive time.
    pub rx_timestamps: bool,
    v6: bool,
    /// Errors come through the socket's error queue (IP_RECVERR: datagram sockets; a raw socket
    /// receives the error packets themselves).
    recverr: bool,
    dest: SockAddr,
    id: u16,
    cookie: u64,
}

impl IcmpSocket {
    /// Open a datagram ICMP socket, or a raw one if that is refused; `ttl`: the requests'
    /// TTL or hop limit (ping's -t), else the system's.
    pub fn open(target: IpAddr, ttl: Option<u8>) -> io::Result<Self> {
        let (sock, kind) = new_socket(target)?;
        sock.set_nonblocking(true)?;
        let rx_timestamps = enable_rx_timestamps(&sock);
        let v6 = target.is_ipv6();
        let recverr = set_ip_options(&sock, v6, ttl, kind)?;
        let dest = SockAddr::from(SocketAddr::new(target, 0));
        Ok(IcmpSocket {
            // SAFETY: the socket stays open for as long as the AsyncFd owns it.
            fd: unsafe { AsyncFd::register(sock) }.map_err(io::Error::from)?,
            kind,
            rx_timestamps,
            v6,
            recverr,
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

    /// One non-blocking `recvmsg()` (of the error queue with `MSG_ERRQUEUE`).
    fn recv_msg(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<Datagram> {
        recv_msg(self.fd.get_ref().as_raw_fd(), buf, flags)
    }

    /// The next of our packets already queued, without waiting: Ok(None) when nothing is
    /// there; `Some(None)`: a packet that is not ours (counted in `foreign`).
    fn take(&self, buf: &mut [u8], foreign: &mut u64) -> io::Result<Option<Option<Received>>> {
        if self.recverr {
            match self.recv_msg(buf, libc::MSG_ERRQUEUE) {
                Ok(d) => {
                    let r = self.queued_error(&buf[..d.len], &d);
                    if r.is_none() {
                        *foreign += 1;
                    }
                    return Ok(Some(r));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        match self.recv_msg(buf, 0) {
            Ok(d) => {
                let r = self.decode(&buf[..d.len], &d);
                if r.is_none() {
                    *foreign += 1;
                }
                Ok(Some(r))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One non-blocking receive straight to the syscall (busy polling).
    /// Ok(None): nothing there; Ok(Some(None)): a packet that is not ours.
    pub fn try_recv(
        &self,
        buf: &mut [u8],
        foreign: &mut u64,
    ) -> io::Result<Option<Option<Received>>> {
        self.take(buf, foreign)
    }

    /// An echo reply of ours, or (raw sockets) an ICMP error quoting one of our requests.
    fn decode(&self, b: &[u8], d: &Datagram) -> Option<Received> {
        let id = match self.kind {
            IcmpSocketKind::Raw => Some(self.id),
            IcmpSocketKind::Dgram => None,
        };
        let ip_header = self.kind == IcmpSocketKind::Raw && !self.v6;
        if let Some(seq) = decode_echo_reply(b, self.v6, ip_header, id, self.cookie) {
            return Some(Received::Reply(Reply {
                seq,
                rx_real_ns: d.rx_real_ns,
                ttl: d
                    .ttl
                    .or_else(|| ip_header.then(|| b.get(8).copied()).flatten()),
            }));
        }
        let (seq16, ty, code, info) = decode_error_packet(b, self.v6, ip_header, id?)?;
        Some(Received::Error(IcmpError {
            seq16,
            from: d.from?,
            text: error_text(self.v6, ty, code, info),
        }))
    }

    /// An error-queue message: our request as sent (the ICMP header on), with the error.
    fn queued_error(&self, b: &[u8], d: &Datagram) -> Option<Received> {
        let (ty, code, info, offender) = d.ext_err?;
        let want = if self.v6 { 128 } else { 8 };
        if b.len() < 8 || b[0] != want {
            return None;
        }
        Some(Received::Error(IcmpError {
            seq16: u16::from_be_bytes([b[6], b[7]]),
            from: offender.or(d.from)?,
            text: error_text(self.v6, ty, code, info),
        }))
    }

    /// Receive until one of our echo replies, or an error about one of our requests, arrives.
    /// Packets that are not ours are skipped (counted in `foreign`).
    pub async fn recv(&self, buf: &mut [u8], foreign: &mut u64) -> io::Result<Received> {
        loop {
            let r = self
                .fd
                .async_io(Interest::READABLE | Interest::ERROR, |_| {
                    match self.take(buf, foreign)? {
                        None => Err(io::ErrorKind::WouldBlock.into()),
                        Some(r) => Ok(r),
                    }
                })
                .await?;
            if let Some(r) = r {
                return Ok(r);
            }
        }
    }
}

/// Set an integer socket option.
fn set_int(s: &Socket, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid fd and an int of the option's size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `recvmsg(fd, MSG_DONTWAIT | flags)` with the sender's address and the control messages
/// rttscope asks for: the receive timestamp, the TTL / hop limit, an extended error.
fn recv_msg(fd: libc::c_int, buf: &mut [u8], flags: libc::c_int) -> io::Result<Datagram> {
    // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = [0u64; 64];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut name as *mut libc::sockaddr_storage as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: every pointer in msg points into a buffer that outlives the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut d = Datagram {
        len: n as usize,
        rx_real_ns: None,
        ttl: None,
        // SAFETY: the kernel wrote msg_namelen bytes of a socket address.
        from: unsafe { sockaddr_ip(&name as *const _ as *const libc::sockaddr, msg.msg_namelen) },
        ext_err: None,
    };
    // SAFETY: the CMSG_* walk stays inside msg_controllen of `control`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: c points to a complete cmsghdr (CMSG_FIRSTHDR/NXTHDR check the length).
        unsafe { control_message(&*c, libc::CMSG_DATA(c), &mut d) };
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok(d)
}

/// One control message into `d`. Safety: `data` points to the message's data, as long as
/// `h.cmsg_len` says.
unsafe fn control_message(h: &libc::cmsghdr, data: *const u8, d: &mut Datagram) {
    let len = h.cmsg_len - (data as usize - h as *const libc::cmsghdr as usize);
    match (h.cmsg_level, h.cmsg_type) {
        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) if len >= 16 => {
            // SAFETY: a timespec's worth of data (checked above).
            let ts = unsafe { std::ptr::read_unaligned(data as *const libc::timespec) };
            if ts.tv_sec > 0 && ts.tv_nsec >= 0 {
                d.rx_real_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
        }
        (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT)
            if len >= 4 =>
        {
            // SAFETY: an int's worth of data (checked above).
            let v = unsafe { std::ptr::read_unaligned(data as *const libc::c_int) };
            d.ttl = u8::try_from(v).ok();
        }
        (libc::IPPROTO_IP, libc::IP_RECVERR) | (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
            if len >= std::mem::size_of::<libc::sock_extended_err>() =>
        {
            // SAFETY: a sock_extended_err's worth of data (checked above).
            let e = unsafe { std::ptr::read_unaligned(data as *const libc::sock_extended_err) };
            if e.ee_origin == libc::SO_EE_ORIGIN_ICMP || e.ee_origin == libc::SO_EE_ORIGIN_ICMP6 {
                // SO_EE_OFFENDER: the sender's address right after the structure.
                let off = std::mem::size_of::<libc::sock_extended_err>();
                // SAFETY: the rest of the message's data, `len - off` bytes.
                let from = unsafe {
                    sockaddr_ip(data.add(off) as *const libc::sockaddr, (len - off) as _)
                };
                d.ext_err = Some((e.ee_type, e.ee_code, e.ee_info, from));
            }
        }
        _ => {}
    }
}

/// The address of a sockaddr_in / sockaddr_in6 of `len` bytes. Safety: `sa` points to `len`
/// readable bytes.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr, len: libc::socklen_t) -> Option<IpAddr> {
    let len = len as usize;
    if len < std::mem::size_of::<libc::sockaddr>() {
        return None;
    }
    // SAFETY: at least a sockaddr's bytes (checked above), and each case its own size.
    unsafe {
        match std::ptr::read_unaligned(sa).sa_family as libc::c_int {
            libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
                let a = std::ptr::read_unaligned(sa as *const libc::sockaddr_in);
                Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let a = std::ptr::read_unaligned(sa as *const libc::sockaddr_in6);
                Some(IpAddr::from(a.sin6_addr.s6_addr))
            }
            _ => None,
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

/// An ICMP error packet (raw sockets) quoting our echo request with identifier `id`:
/// (the request's 16-bit sequence, the error's type, code and info: the MTU or pointer).
/// IPv4: destination unreachable (3), source quench (4), redirect (5), time exceeded (11),
/// parameter problem (12); IPv6: destination unreachable (1), packet too big (2), time
/// exceeded (3), parameter problem (4). The quote is the request's IP header and at least its
/// first 8 bytes (type, code, checksum, identifier, sequence).
pub fn decode_error_packet(
    b: &[u8],
    v6: bool,
    ip_header: bool,
    id: u16,
) -> Option<(u16, u8, u8, u32)> {
    let b = if ip_header {
        b.get((*b.first()? & 0x0f) as usize * 4..)?
    } else {
        b
    };
    let (ty, code) = (*b.first()?, *b.get(1)?);
    let info = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
    let errors: &[u8] = if v6 {
        &[1, 2, 3, 4]
    } else {
        &[3, 4, 5, 11, 12]
    };
    if !errors.contains(&ty) {
        return None;
    }
    let quoted = if v6 {
        // the request's IPv6 header (40 bytes, next header ICMPv6), then its ICMPv6 header
        (*b.get(8 + 6)? == 58).then_some(())?;
        b.get(48..56)?
    } else {
        let ip = b.get(8..)?;
        let ihl = (*ip.first()? & 0x0f) as usize * 4;
        (ihl >= 20 && *ip.get(9)? == 1).then_some(())?;
        ip.get(ihl..ihl + 8)?
    };
    let want = if v6 { 128 } else { 8 };
    if quoted[0] != want || u16::from_be_bytes([quoted[4], quoted[5]]) != id {
        return None;
    }
    Some((u16::from_be_bytes([quoted[6], quoted[7]]), ty, code, info))
}

/// ping's words for an ICMP error (iputils: `pr_icmph` for IPv4, `print_icmp` for IPv6).
pub fn error_text(v6: bool, ty: u8, code: u8, info: u32) -> String {
    if v6 {
        return error_text_v6(ty, code, info);
    }
    let s = match (ty, code) {
        (3, 0) => "Destination Net Unreachable",
        (3, 1) => "Destination Host Unreachable",
        (3, 2) => "Destination Protocol Unreachable",
        (3, 3) => "Destination Port Unreachable",
        (3, 4) => return format!("Frag needed and DF set (mtu = {})", info & 0xffff),
        (3, 5) => "Source Route Failed",
        (3, 6) => "Destination Net Unknown",
        (3, 7) => "Destination Host Unknown",
        (3, 8) => "Source Host Isolated",
        (3, 9) => "Destination Net Prohibited",
        (3, 10) => "Destination Host Prohibited",
        (3, 11) => "Destination Net Unreachable for Type of Service",
        (3, 12) => "Destination Host Unreachable for Type of Service",
        (3, 13) => "Packet filtered",
        (3, 14) => "Precedence Violation",
        (3, 15) => "Precedence Cutoff",
        (3, c) => return format!("Dest Unreachable, Bad Code: {c}"),
        (4, _) => "Source Quench",
        (5, 0) => "Redirect Network",
        (5, 1) => "Redirect Host",
        (5, 2) => "Redirect Type of Service and Network",
        (5, 3) => "Redirect Type of Service and Host",
        (5, c) => return format!("Redirect, Bad Code: {c}"),
        (11, 0) => "Time to live exceeded",
        (11, 1) => "Frag reassembly time exceeded",
        (11, c) => return format!("Time exceeded, Bad Code: {c}"),
        (12, _) => return format!("Parameter problem: pointer = {}", info >> 24),
        (t, _) => return format!("Bad ICMP type: {t}"),
    };
    s.to_string()
}

fn error_text_v6(ty: u8, code: u8, info: u32) -> String {
    match (ty, code) {
        (1, c) => format!(
            "Destination unreachable: {}",
            match c {
                0 => "No route".to_string(),
                1 => "Administratively prohibited".into(),
                2 => "Beyond scope of source address".into(),
                3 => "Address unreachable".into(),
                4 => "Port unreachable".into(),
                c => format!("Unknown code {c}"),
            }
        ),
        (2, 0) => format!("Packet too big: mtu={info}"),
        (2, c) => format!("Packet too big: mtu={info}, code={c}"),
        (3, 0) => "Time exceeded: Hop limit".into(),
        (3, 1) => "Time exceeded: Defragmentation failure".into(),
        (3, c) => format!("Time exceeded: code {c}"),
        (4, c) => format!(
            "Parameter problem: {} at {info}",
            match c {
                0 => "Wrong header field".to_string(),
                1 => "Unknown header".into(),
                2 => "Unknown option".into(),
                c => format!("code {c}"),
            }
        ),
        (t, _) => format!("Unknown icmp type: {t}"),
    }
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

    /// An ICMP error quoting `req` (an echo request as sent), IPv4 with headers as a raw
    /// socket hands it over: the router's IP header, the error, the request's IP header.
    fn error4(ty: u8, code: u8, req: &[u8]) -> Vec<u8> {
        let mut ip = vec![0u8; 20];
        ip[0] = 0x45;
        ip[9] = 1;
        let mut p = ip.clone();
        p.extend_from_slice(&[ty, code, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&ip);
        p.extend_from_slice(&req[..8]);
        p
    }

    #[test]
    fn errors_quoting_our_requests_are_decoded() {
        let req = encode_echo(false, 0x1234, 70_001, 9, 56);
        let seq16 = 70_001u64 as u16;
        let p = error4(11, 0, &req);
        assert_eq!(
            decode_error_packet(&p, false, true, 0x1234),
            Some((seq16, 11, 0, 0))
        );
        // another process's request (its identifier), or an echo reply: not ours / not an error
        assert_eq!(decode_error_packet(&p, false, true, 0x4321), None);
        let mut reply = req.clone();
        reply[0] = 0;
        assert_eq!(decode_error_packet(&reply, false, false, 0x1234), None);
        // truncated quote
        assert_eq!(
            decode_error_packet(&p[..p.len() - 1], false, true, 0x1234),
            None
        );
        assert_eq!(decode_error_packet(&[], false, true, 0x1234), None);
        // IPv6: error header, the request's IPv6 header (next header 58), its ICMPv6 header
        let req6 = encode_echo(true, 7, 3, 9, 16);
        let mut p6 = vec![1u8, 0, 0, 0, 0, 0, 0, 0];
        let mut ip6 = vec![0u8; 40];
        ip6[0] = 0x60;
        ip6[6] = 58;
        p6.extend_from_slice(&ip6);
        p6.extend_from_slice(&req6[..8]);
        assert_eq!(decode_error_packet(&p6, true, false, 7), Some((3, 1, 0, 0)));
        p6[8 + 6] = 17;
        assert_eq!(decode_error_packet(&p6, true, false, 7), None);
    }

    #[test]
    fn error_texts_are_pings() {
        assert_eq!(error_text(false, 3, 1, 0), "Destination Host Unreachable");
        assert_eq!(error_text(false, 11, 0, 0), "Time to live exceeded");
        assert_eq!(
            error_text(false, 3, 4, 1400),
            "Frag needed and DF set (mtu = 1400)"
        );
        assert_eq!(
            error_text(false, 3, 99, 0),
            "Dest Unreachable, Bad Code: 99"
        );
        assert_eq!(
            error_text(true, 1, 0, 0),
            "Destination unreachable: No route"
        );
        assert_eq!(
            error_text(true, 1, 3, 0),
            "Destination unreachable: Address unreachable"
        );
        assert_eq!(error_text(true, 3, 0, 0), "Time exceeded: Hop limit");
        assert_eq!(error_text(true, 2, 0, 1280), "Packet too big: mtu=1280");
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
