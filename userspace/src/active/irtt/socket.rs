//! The irtt client's socket: opening it with irtt's options (DSCP, TTL, DF,
//! local address), the kernel's receive timestamps, and the open handshake.
use std::io::{ErrorKind, IoSliceMut};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};

use super::client::{split_host_port, Df, IrttConfig, Rejected};
use super::packet::{decode_open_reply, encode_open, Key, OpenReply, MAX_PACKET};

/// CLOCK_MONOTONIC as signed nanoseconds (the irtt arithmetic is signed).
pub(super) fn mono_ns() -> i64 {
    crate::sys::clock::mono_ns() as i64
}

/// Sleep until an absolute CLOCK_MONOTONIC time (ns), in slices so `cancel` is honoured.
pub(super) fn sleep_until_mono(target: i64, cancel: &AtomicBool) {
    loop {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let now = mono_ns();
        if now >= target {
            return;
        }
        let until = target.min(now + 100_000_000);
        let ts = libc::timespec {
            tv_sec: until / 1_000_000_000,
            tv_nsec: until % 1_000_000_000,
        };
        // SAFETY: plain syscall with a timespec we own; EINTR just loops.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            );
        }
    }
}

pub(super) fn open_socket(cfg: &IrttConfig, remote: SocketAddr) -> Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if remote.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s =
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).context("creating the UDP socket")?;
    let local: SocketAddr = match &cfg.local {
        Some(l) => resolve_local(l, remote)?,
        None if remote.is_ipv4() => "0.0.0.0:0".parse().unwrap(),
        None => "[::]:0".parse().unwrap(),
    };
    s.bind(&local.into())
        .with_context(|| format!("binding {local}"))?;
    if cfg.dscp != 0 {
        if remote.is_ipv4() {
            s.set_tos(u32::from(cfg.dscp))
        } else {
            s.set_tclass_v6(u32::from(cfg.dscp))
        }
        .context("setting the DSCP/ToS byte")?;
    }
    if cfg.ttl != 0 {
        if remote.is_ipv4() {
            s.set_ttl(cfg.ttl)
        } else {
            s.set_unicast_hops_v6(cfg.ttl)
        }
        .context("setting the TTL")?;
    }
    if cfg.df != Df::Default {
        set_df(&s, remote.is_ipv4(), cfg.df == Df::True)?;
    }
    s.connect(&remote.into())
        .with_context(|| format!("connecting to {remote}"))?;
    let u: UdpSocket = s.into();
    setsockopt(&u, sockopt::ReceiveTimestampns, &true).context("enabling SO_TIMESTAMPNS")?;
    u.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(u)
}

fn resolve_local(l: &str, remote: SocketAddr) -> Result<SocketAddr> {
    if let Some(p) = l.strip_prefix(':') {
        let port: u16 = p
            .parse()
            .with_context(|| format!("'{p}' is not a port number"))?;
        let ip: std::net::IpAddr = if remote.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        return Ok(SocketAddr::new(ip, port));
    }
    let (h, port) = split_host_port(l)?;
    let explicit_port = l.contains("]:") || (!l.starts_with('[') && l.matches(':').count() == 1);
    let port = if explicit_port { port } else { 0 };
    (h.as_str(), port)
        .to_socket_addrs()?
        .find(|a| a.is_ipv4() == remote.is_ipv4())
        .with_context(|| format!("no local address {l} of the server's IP version"))
}

/// A received datagram with its arrival time on both clocks.
pub(super) struct Rx {
    pub len: usize,
    pub mono: i64,
    pub wall: i64,
    pub kernel: bool,
}

pub(super) fn recv_stamped(
    sock: &UdpSocket,
    buf: &mut [u8],
    cmsg: &mut Vec<u8>,
) -> std::io::Result<Rx> {
    let mut iov = [IoSliceMut::new(buf)];
    let r = recvmsg::<SockaddrStorage>(sock.as_raw_fd(), &mut iov, Some(cmsg), MsgFlags::empty())
        .map_err(std::io::Error::from)?;
    let (now_mono, now_wall) = (mono_ns(), crate::sys::clock::realtime_ns());
    let mut rx = Rx {
        len: r.bytes,
        mono: now_mono,
        wall: now_wall,
        kernel: false,
    };
    if let Ok(cmsgs) = r.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmTimestampns(ts) = c {
                let k = ts.tv_sec() * 1_000_000_000 + ts.tv_nsec();
                let lag = now_wall - k;
                // map the kernel's (wall clock) stamp onto the monotonic clock
                if (0..1_000_000_000).contains(&lag) {
                    rx.mono = now_mono - lag;
                    rx.wall = k;
                    rx.kernel = true;
                }
            }
        }
    }
    Ok(rx)
}

pub(super) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// The open handshake: send the open request on each timeout until the server answers.
pub(super) fn open(
    sock: &UdpSocket,
    cfg: &IrttConfig,
    key: &Key,
    rejected: &mut Rejected,
    cancel: &AtomicBool,
) -> Result<OpenReply> {
    let req = encode_open(&cfg.requested_params(), key, cfg.no_test);
    let mut buf = vec![0u8; MAX_PACKET];
    for to in &cfg.open_timeouts {
        sock.send(&req).context("sending the open request")?;
        let deadline = mono_ns() + to.as_nanos() as i64;
        while mono_ns() < deadline {
            if cancel.load(Ordering::Relaxed) {
                bail!("interrupted while opening");
            }
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if is_timeout(&e) => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    rejected.icmp_errors += 1;
                    continue;
                }
                Err(e) => return Err(e).context("receiving the open reply"),
            };
            match decode_open_reply(&buf[..n], key) {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => rejected.count(e),
            }
        }
    }
    let hint = if rejected.total() > 0 {
        format!(" ({} replies rejected: {rejected:?})", rejected.total())
    } else if rejected.icmp_errors > 0 {
        " (ICMP port unreachable: is `irtt server` running there?)".to_string()
    } else if key.is_set() {
        " (is `irtt server` running there, with the same --hmac key?)".to_string()
    } else {
        " (is `irtt server` running there? does it require --hmac?)".to_string()
    };
    bail!(
        "no reply from the irtt server at {} after {} open request(s){hint}",
        sock.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
        cfg.open_timeouts.len()
    )
}

/// The do-not-fragment bit: set (`on`) or never set, IPv4 or IPv6.
fn set_df(s: &socket2::Socket, v4: bool, on: bool) -> Result<()> {
    let (level, opt, val) = match (v4, on) {
        (true, true) => (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        ),
        (true, false) => (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DONT,
        ),
        (false, true) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        ),
        (false, false) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DONT,
        ),
    };
    // SAFETY: setsockopt with a c_int value we own, on a socket we own.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("setting the do-not-fragment bit");
    }
    Ok(())
}
