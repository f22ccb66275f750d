//! The irtt client: open handshake with parameter negotiation, an
//! isochronous sender, a receiver, the end-of-test wait and the close.
//!
//! The timing-critical parts run on two dedicated OS threads: the sender
//! sleeps with `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` to each send
//! time (tokio's timer wheel has 1 ms granularity, too coarse for a 10 ms
//! isochronous schedule), and the receiver takes the kernel's receive
//! timestamp of each reply (`SO_TIMESTAMPNS`) and maps it onto the monotonic
//! clock. The async API ([`super::run_irtt`]) runs them from a blocking task.
use std::io::{ErrorKind, IoSliceMut};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::packet::{
    decode_echo_reply, decode_open_reply, encode_close, encode_open, EchoLayout, EchoRequest, Key,
    OpenReply, PacketError, MAX_PACKET,
};
use super::params::{Clock, Params, ReceivedStats, StampAt, PROTOCOL_VERSION};
use super::stats::{RoundTrip, RunCounters, MAX_ROUND_TRIPS, RT_LATE};

/// irtt's default port.
pub const DEFAULT_PORT: u16 = 2112;
/// irtt refuses open timeouts shorter than this.
pub const MIN_OPEN_TIMEOUT: Duration = Duration::from_millis(200);
/// irtt rejects a server-reduced interval below this.
const MIN_RESTRICTED_INTERVAL_NS: i64 = 1_000_000_000;

/// Client payload fill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fill {
    None,
    Rand,
    Pattern(Vec<u8>),
}

/// End-of-test wait for outstanding replies (irtt's `--wait`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// factor x max RTT, or the duration if no reply arrived
    MaxRtt(f64, Duration),
    /// factor x mean RTT, or the duration if no reply arrived
    MeanRtt(f64, Duration),
    Fixed(Duration),
}

impl Wait {
    /// Parse `3x4s`, `2r500ms` or `1500ms`.
    pub fn parse(s: &str) -> Result<Wait, String> {
        let bad =
            || format!("'{s}' is not a wait: use #xDURATION, #rDURATION or DURATION (e.g. 3x4s)");
        for (sep, max) in [('x', true), ('r', false)] {
            if let Some((f, d)) = s.split_once(sep) {
                let f: f64 = f.parse().map_err(|_| bad())?;
                let d = crate::analysis::units::parse_duration(d).map_err(|_| bad())?;
                if !(f.is_finite() && f >= 0.0) {
                    return Err(bad());
                }
                return Ok(if max {
                    Wait::MaxRtt(f, d)
                } else {
                    Wait::MeanRtt(f, d)
                });
            }
        }
        crate::analysis::units::parse_duration(s)
            .map(Wait::Fixed)
            .map_err(|_| bad())
    }

    fn duration(&self, max_rtt: Option<i64>, mean_rtt: Option<f64>) -> Duration {
        match *self {
            Wait::Fixed(d) => d,
            Wait::MaxRtt(f, d) => {
                max_rtt.map_or(d, |m| Duration::from_nanos((m.max(0) as f64 * f) as u64))
            }
            Wait::MeanRtt(f, d) => {
                mean_rtt.map_or(d, |m| Duration::from_nanos((m.max(0.0) * f) as u64))
            }
        }
    }
}

/// The do-not-fragment setting (irtt's `--df`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Df {
    /// OS default (path MTU discovery as configured)
    Default,
    /// never set DF: the kernel fragments large packets
    False,
    /// always set DF: packets above the path MTU fail to send
    True,
}

/// Which address family to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IpVersion {
    Any,
    V4,
    V6,
}

/// Told of every reply as it arrives: its seqno, its round trip and the
/// previous seqno's (when that one was answered), e.g. for irtt's line per
/// packet. Called from the receiver thread, outside its lock.
#[derive(Clone)]
pub struct IrttReplyHook(pub Arc<IrttReplyFn>);

/// What an [`IrttReplyHook`] calls: (seqno, round trip, previous round trip).
pub type IrttReplyFn = dyn Fn(u32, &RoundTrip, Option<&RoundTrip>) + Send + Sync;

impl std::fmt::Debug for IrttReplyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IrttReplyHook")
    }
}

/// Everything that defines an irtt test, as supplied.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IrttConfig {
    /// Server as given: `HOST`, `HOST:PORT`, `[V6]:PORT`.
    pub server: String,
    pub duration: Duration,
    pub interval: Duration,
    /// Requested packet length (0: the smallest the headers allow).
    pub length: usize,
    pub received_stats: ReceivedStats,
    pub stamp_at: StampAt,
    pub clock: Clock,
    /// Written as-is to the IP ToS / traffic-class byte (irtt's `--dscp` semantics).
    pub dscp: u8,
    pub fill: Fill,
    pub fill_one: bool,
    /// Fill requested from the server (`--sfill`).
    pub server_fill: Option<String>,
    /// HMAC-MD5 key (never serialized; `hmac` records whether one was used).
    #[serde(skip)]
    pub hmac_key: Option<Vec<u8>>,
    pub hmac: bool,
    pub open_timeouts: Vec<Duration>,
    pub wait: Wait,
    /// IP TTL / hop limit (0: OS default).
    pub ttl: u32,
    pub df: Df,
    pub ip_version: IpVersion,
    pub local: Option<String>,
    /// Accept server restrictions instead of failing.
    pub loose: bool,
    /// Only open (and close) to validate parameters.
    pub no_test: bool,
    /// Told of every reply (none by default; not a setting).
    #[serde(skip)]
    pub on_reply: Option<IrttReplyHook>,
}

impl Default for IrttConfig {
    fn default() -> Self {
        IrttConfig {
            server: String::new(),
            duration: Duration::from_secs(60),
            interval: Duration::from_secs(1),
            length: 0,
            received_stats: ReceivedStats::Both,
            stamp_at: StampAt::Both,
            clock: Clock::Both,
            dscp: 0,
            fill: Fill::None,
            fill_one: false,
            server_fill: None,
            hmac_key: None,
            hmac: false,
            open_timeouts: vec![
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(4),
                Duration::from_secs(8),
            ],
            wait: Wait::MaxRtt(3.0, Duration::from_secs(4)),
            ttl: 0,
            df: Df::Default,
            ip_version: IpVersion::Any,
            local: None,
            loose: false,
            no_test: false,
            on_reply: None,
        }
    }
}

impl IrttConfig {
    /// The parameters we ask the server for.
    pub fn requested_params(&self) -> Params {
        Params {
            protocol_version: PROTOCOL_VERSION,
            duration_ns: self.duration.as_nanos().min(i64::MAX as u128) as i64,
            interval_ns: self.interval.as_nanos().min(i64::MAX as u128) as i64,
            length: self.length as i64,
            received_stats: self.received_stats,
            stamp_at: self.stamp_at,
            clock: Some(self.clock),
            dscp: i64::from(self.dscp),
            server_fill: self.server_fill.clone().unwrap_or_default(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            bail!("the interval must be greater than 0");
        }
        if self.duration.is_zero() {
            bail!("the duration must be greater than 0");
        }
        if let Some(t) = self.open_timeouts.iter().find(|t| **t < MIN_OPEN_TIMEOUT) {
            bail!("open timeout {t:?} is shorter than irtt's minimum of 200ms");
        }
        if self.open_timeouts.is_empty() {
            bail!("at least one open timeout is needed");
        }
        if let Some(f) = &self.server_fill {
            if f.len() > super::params::MAX_SERVER_FILL_LEN {
                bail!("server fill '{f}' is longer than irtt's 32 bytes");
            }
        }
        let n = expected_round_trips(self.duration, self.interval);
        if n > MAX_ROUND_TRIPS {
            bail!(
                "{n} round trips ({:?} at {:?}) exceed the limit of {MAX_ROUND_TRIPS} (72 bytes each): shorten the duration or lengthen the interval",
                self.duration,
                self.interval
            );
        }
        Ok(())
    }
}

/// irtt's packet count for a duration and interval: 1 + duration/interval.
pub fn expected_round_trips(d: Duration, i: Duration) -> u64 {
    1 + (d.as_nanos() / i.as_nanos().max(1)).min(u64::MAX as u128 - 1) as u64
}

/// Resolve `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT` or a bare IPv6 address.
pub fn resolve(server: &str, ipv: IpVersion) -> Result<SocketAddr> {
    let (host, port) = split_host_port(server)?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .collect();
    addrs
        .into_iter()
        .find(|a| match ipv {
            IpVersion::Any => true,
            IpVersion::V4 => a.is_ipv4(),
            IpVersion::V6 => a.is_ipv6(),
        })
        .with_context(|| format!("{host} has no address of the requested IP version"))
}

pub fn split_host_port(s: &str) -> Result<(String, u16)> {
    let port = |p: &str| {
        p.parse::<u16>()
            .with_context(|| format!("'{p}' is not a port number"))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .with_context(|| format!("'{s}': missing ']'"))?;
        return match after {
            "" => Ok((h.to_string(), DEFAULT_PORT)),
            p if p.starts_with(':') => Ok((h.to_string(), port(&p[1..])?)),
            _ => bail!("'{s}' is not HOST[:PORT]"),
        };
    }
    match s.matches(':').count() {
        0 => Ok((s.to_string(), DEFAULT_PORT)),
        1 => {
            let (h, p) = s.split_once(':').unwrap();
            Ok((h.to_string(), port(p)?))
        }
        _ => Ok((s.to_string(), DEFAULT_PORT)), // bare IPv6 address
    }
}

/// Rejected packets, by reason. Every packet we drop is counted here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    pub truncated: u64,
    pub bad_magic: u64,
    pub invalid_flags: u64,
    pub no_hmac: u64,
    pub bad_hmac: u64,
    pub unexpected_hmac: u64,
    pub not_reply: u64,
    pub unexpected_open: u64,
    pub wrong_token: u64,
    pub bad_params: u64,
    /// Well-formed replies for a seqno we never sent.
    pub unknown_seqno: u64,
    /// ICMP errors (e.g. port unreachable) reported on the socket.
    pub icmp_errors: u64,
}

impl Rejected {
    pub fn count(&mut self, e: PacketError) {
        let c = match e {
            PacketError::Truncated => &mut self.truncated,
            PacketError::BadMagic => &mut self.bad_magic,
            PacketError::InvalidFlags => &mut self.invalid_flags,
            PacketError::NoHmac => &mut self.no_hmac,
            PacketError::BadHmac => &mut self.bad_hmac,
            PacketError::UnexpectedHmac => &mut self.unexpected_hmac,
            PacketError::NotReply => &mut self.not_reply,
            PacketError::UnexpectedOpen => &mut self.unexpected_open,
            PacketError::WrongToken => &mut self.wrong_token,
            PacketError::BadParams => &mut self.bad_params,
        };
        *c += 1;
    }
    pub fn total(&self) -> u64 {
        self.truncated
            + self.bad_magic
            + self.invalid_flags
            + self.no_hmac
            + self.bad_hmac
            + self.unexpected_hmac
            + self.not_reply
            + self.unexpected_open
            + self.wrong_token
            + self.bad_params
            + self.unknown_seqno
    }
}

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

/// CLOCK_MONOTONIC as signed nanoseconds (the irtt arithmetic is signed).
fn mono_ns() -> i64 {
    crate::sys::clock::mono_ns() as i64
}

/// Sleep until an absolute CLOCK_MONOTONIC time (ns), in slices so `cancel` is honoured.
fn sleep_until_mono(target: i64, cancel: &AtomicBool) {
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

fn open_socket(cfg: &IrttConfig, remote: SocketAddr) -> Result<UdpSocket> {
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
        let (level, opt, val) = match (remote.is_ipv4(), cfg.df == Df::True) {
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
                std::os::fd::AsRawFd::as_raw_fd(&s),
                level,
                opt,
                (&val as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("setting the do-not-fragment bit");
        }
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
struct Rx {
    len: usize,
    mono: i64,
    wall: i64,
    kernel: bool,
}

fn recv_stamped(sock: &UdpSocket, buf: &mut [u8], cmsg: &mut Vec<u8>) -> std::io::Result<Rx> {
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

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// The open handshake: send the open request on each timeout until the server answers.
fn open(
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

fn fmt_ns(ns: i64) -> String {
    format!("{:?}", Duration::from_nanos(ns.max(0) as u64))
}

/// Compare what the server granted with what we asked. Returns the
/// restrictions (accepted with `--loose`) or fails on invalid changes.
pub fn check_params(want: &Params, got: &Params) -> Result<Vec<String>> {
    let mut r = Vec::new();
    if got.protocol_version != PROTOCOL_VERSION {
        bail!(
            "the server speaks irtt protocol version {}, we speak version {PROTOCOL_VERSION}",
            got.protocol_version
        );
    }
    if got.duration_ns > want.duration_ns {
        bail!(
            "the server tried to lengthen the duration from {} to {}",
            fmt_ns(want.duration_ns),
            fmt_ns(got.duration_ns)
        );
    }
    if got.duration_ns < want.duration_ns {
        r.push(format!(
            "server reduced the duration from {} to {} (its -d maximum)",
            fmt_ns(want.duration_ns),
            fmt_ns(got.duration_ns)
        ));
    }
    if got.interval_ns <= 0 {
        bail!("the server granted no interval");
    }
    if got.interval_ns > want.interval_ns {
        r.push(format!(
            "server increased the interval from {} to {} (its -i minimum)",
            fmt_ns(want.interval_ns),
            fmt_ns(got.interval_ns)
        ));
    }
    if got.interval_ns < want.interval_ns {
        if got.interval_ns < MIN_RESTRICTED_INTERVAL_NS {
            bail!(
                "the server tried to reduce the interval to {} (below 1s), from {}",
                fmt_ns(got.interval_ns),
                fmt_ns(want.interval_ns)
            );
        }
        r.push(format!(
            "server reduced the interval from {} to {} (its --timeout allows at most timeout/4)",
            fmt_ns(want.interval_ns),
            fmt_ns(got.interval_ns)
        ));
    }
    if got.length > want.length {
        bail!(
            "the server tried to increase the packet length from {} to {}",
            want.length,
            got.length
        );
    }
    if got.length < want.length {
        r.push(format!(
            "server reduced the packet length from {} to {} (its -l maximum)",
            want.length, got.length
        ));
    }
    if got.received_stats != want.received_stats {
        r.push(format!(
            "server changed received stats from {} to {}",
            want.received_stats.name(),
            got.received_stats.name()
        ));
    }
    if got.stamp_at != want.stamp_at {
        r.push(format!(
            "server restricted timestamps from {} to {} (its --tstamp setting)",
            want.stamp_at.name(),
            got.stamp_at.name()
        ));
    }
    if got.stamp_at != StampAt::None && got.clock != want.clock {
        r.push(format!(
            "server restricted clocks from {} to {}",
            want.clock.map_or("none", Clock::name),
            got.clock.map_or("none", Clock::name)
        ));
    }
    if got.dscp != want.dscp {
        r.push(format!(
            "server does not allow DSCP {} (it runs with --no-dscp or cannot set it)",
            want.dscp
        ));
    }
    if got.server_fill != want.server_fill {
        r.push(format!(
            "server refused the fill '{}' (granted '{}'; see its --allow-fills)",
            want.server_fill, got.server_fill
        ));
    }
    Ok(r)
}

struct Shared {
    rts: Vec<RoundTrip>,
    counters: RunCounters,
    rejected: Rejected,
    last_seqno: Option<u32>,
    kernel_rx_stamps: u64,
    server_closed: bool,
    receive_error: Option<String>,
}

/// Run a whole test (blocking). `cancel` stops it early; partial results are returned.
pub fn run_blocking(cfg: &IrttConfig, cancel: Arc<AtomicBool>) -> Result<RawRun> {
    cfg.validate()?;
    let remote = resolve(&cfg.server, cfg.ip_version)?;
    let sock = open_socket(cfg, remote)?;
    let local_addr = sock.local_addr()?;
    let key = cfg.hmac_key.as_deref().map(Key::new).unwrap_or_default();
    let mut rejected = Rejected::default();
    let want = cfg.requested_params();
    let opened = open(&sock, cfg, &key, &mut rejected, &cancel)?;
    let close = |token: u64| {
        if token != 0 {
            let _ = sock.send(&encode_close(token, &key));
        }
    };
    let got = opened.params.clone();
    let restrictions = match check_params(&want, &got) {
        Ok(r) => r,
        Err(e) => {
            close(opened.token);
            return Err(e);
        }
    };
    if !restrictions.is_empty() && !cfg.loose {
        close(opened.token);
        bail!(
            "the irtt server restricted the test: {}; rerun with --loose to accept",
            restrictions.join("; ")
        );
    }
    let clock = got.clock.unwrap_or(Clock::Both);
    let layout = EchoLayout {
        hmac: key.is_set(),
        stats: got.received_stats,
        stamp_at: got.stamp_at,
        clock,
    };
    let packet_length = layout.packet_len(got.length.max(0) as usize);
    let mut run = RawRun {
        local_addr,
        remote_addr: remote,
        negotiated: got.clone(),
        restrictions,
        packet_length,
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
    };
    if cfg.no_test || opened.closed {
        if !opened.closed {
            close(opened.token);
        }
        return Ok(run);
    }
    let token = opened.token;
    let interval = got.interval_ns;
    let duration = got.duration_ns;
    let capacity = expected_round_trips(
        Duration::from_nanos(duration as u64),
        Duration::from_nanos(interval as u64),
    );
    let shared = Arc::new(Mutex::new(Shared {
        rts: Vec::with_capacity(capacity as usize + 1),
        counters: RunCounters::default(),
        rejected: std::mem::take(&mut run.rejected),
        last_seqno: None,
        kernel_rx_stamps: 0,
        server_closed: false,
        receive_error: None,
    }));
    let stop_rx = Arc::new(AtomicBool::new(false));
    let start_mono = mono_ns();
    run.start_wall_ns = crate::sys::clock::realtime_ns();

    // receiver
    let rx_sock = sock.try_clone()?;
    let (sh, stop, key_rx, cancel_rx) =
        (shared.clone(), stop_rx.clone(), key.clone(), cancel.clone());
    let hook = cfg.on_reply.clone();
    let receiver = std::thread::Builder::new()
        .name("irtt-recv".into())
        .spawn(move || {
            let mut buf = vec![0u8; MAX_PACKET];
            let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
            while !stop.load(Ordering::Relaxed) {
                let rx = match recv_stamped(&rx_sock, &mut buf, &mut cmsg) {
                    Ok(rx) => rx,
                    Err(e) if is_timeout(&e) => continue,
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        sh.lock().unwrap().rejected.icmp_errors += 1;
                        continue;
                    }
                    Err(e) => {
                        sh.lock().unwrap().receive_error = Some(e.to_string());
                        break;
                    }
                };
                let decoded =
                    decode_echo_reply(&buf[..rx.len], &layout, &key_rx, token, packet_length);
                let mut g = sh.lock().unwrap();
                let reply = match decoded {
                    Ok(r) => r,
                    Err(e) => {
                        g.rejected.count(e);
                        continue;
                    }
                };
                if reply.closed {
                    g.server_closed = true;
                    cancel_rx.store(true, Ordering::Relaxed);
                    if reply.len < layout.fields_len() {
                        break;
                    }
                }
                let seq = reply.seqno as usize;
                if seq >= g.rts.len() {
                    g.rejected.unknown_seqno += 1;
                    continue;
                }
                let rel = rx.mono - start_mono;
                if g.rts[seq].received() {
                    g.counters.duplicates += 1;
                    g.rts[seq].dups = g.rts[seq].dups.saturating_add(1);
                    g.counters.bytes_received += rx.len as u64;
                    continue;
                }
                let late = g.last_seqno.is_some_and(|l| reply.seqno < l);
                if late {
                    g.counters.late += 1;
                } else {
                    g.last_seqno = Some(reply.seqno);
                }
                if rx.kernel {
                    g.kernel_rx_stamps += 1;
                }
                let rt = &mut g.rts[seq];
                rt.raw_rtt = (rel - rt.send_mono).max(0);
                rt.srv_recv_wall = reply.receive.wall;
                rt.srv_recv_mono = reply.receive.mono;
                rt.srv_send_wall = reply.send.wall;
                rt.srv_send_mono = reply.send.mono;
                rt.window = reply.received_window.unwrap_or(0);
                if late {
                    rt.flags |= RT_LATE;
                }
                let _ = rx.wall;
                let c = &mut g.counters;
                if let Some(n) = reply.received_count {
                    c.server_received_max =
                        Some(c.server_received_max.unwrap_or(0).max(u64::from(n)));
                }
                c.bytes_received += rx.len as u64;
                c.first_recv_mono.get_or_insert(rel);
                c.last_recv_mono = rel;
                if let Some(h) = &hook {
                    let cur = g.rts[seq];
                    let prev = seq.checked_sub(1).map(|p| g.rts[p]);
                    drop(g);
                    (h.0)(reply.seqno, &cur, prev.as_ref().filter(|p| p.received()));
                }
                if reply.closed {
                    break;
                }
            }
        })?;

    // sender (this thread): 1 ns timer slack while it runs (default 50 µs),
    // restored at the end since this may be a pooled thread
    // SAFETY: prctl with integer arguments only.
    let old_slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let mut req = EchoRequest::new(&layout, token, packet_length, &key);
    let mut rng = rand::thread_rng();
    let fill = |req: &mut EchoRequest, rng: &mut rand::rngs::ThreadRng| match &cfg.fill {
        Fill::None => {}
        Fill::Rand => rng.fill_bytes(req.payload_mut()),
        Fill::Pattern(p) if !p.is_empty() => {
            for (i, b) in req.payload_mut().iter_mut().enumerate() {
                *b = p[i % p.len()];
            }
        }
        Fill::Pattern(_) => {}
    };
    fill(&mut req, &mut rng);
    let mut seqno: u32 = 0;
    loop {
        if cancel.load(Ordering::Relaxed) {
            run.interrupted = !shared.lock().unwrap().server_closed;
            break;
        }
        let pkt = req.with_seqno(seqno);
        let pre = {
            let mut g = shared.lock().unwrap();
            let (m, w) = (mono_ns() - start_mono, crate::sys::clock::realtime_ns());
            g.rts.push(RoundTrip::sent(m, w));
            m
        };
        let res = sock.send(pkt);
        let post = mono_ns() - start_mono;
        match res {
            Ok(n) => {
                let mut g = shared.lock().unwrap();
                let c = &mut g.counters;
                c.send_call.push(post - pre);
                c.bytes_sent += n as u64;
                c.first_send_mono.get_or_insert(pre);
                c.last_sent_mono = post;
            }
            Err(e) => {
                let mut g = shared.lock().unwrap();
                let errno = e.raw_os_error().unwrap_or(0);
                if e.kind() == ErrorKind::ConnectionRefused {
                    // an ICMP error from an earlier packet; this one was not sent
                    g.rts.pop();
                    g.rejected.icmp_errors += 1;
                } else if [libc::EPERM, libc::ENOBUFS, libc::EAGAIN].contains(&errno) {
                    // dropped on this host (firewall, full queue): counted and
                    // kept as a round trip lost upstream
                    g.counters.send_failures += 1;
                    g.counters.first_send_mono.get_or_insert(pre);
                    g.counters.last_sent_mono = post;
                } else {
                    g.rts.pop();
                    run.send_error = Some(e.to_string());
                    break;
                }
            }
        }
        seqno = seqno.wrapping_add(1);
        if !cfg.fill_one {
            fill(&mut req, &mut rng);
        }
        // irtt's schedule: the next interval boundary, or the one after if
        // this send was already past half of its interval
        let now = mono_ns() - start_mono;
        let base = interval * (now / interval);
        let next = if post % interval < interval / 2 {
            base + interval
        } else {
            base + 2 * interval
        };
        if next >= duration || u64::from(seqno) >= capacity {
            break;
        }
        sleep_until_mono(start_mono + next, &cancel);
        let woke = mono_ns() - start_mono;
        if !cancel.load(Ordering::Relaxed) {
            shared
                .lock()
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

    // wait for outstanding replies
    if !cancel.load(Ordering::Relaxed) && run.send_error.is_none() {
        let (max_rtt, mean_rtt, done) = {
            let g = shared.lock().unwrap();
            let rtts: Vec<i64> = g.rts.iter().filter_map(|r| r.rtt()).collect();
            let done = rtts.len() >= g.rts.len();
            let mean =
                (!rtts.is_empty()).then(|| rtts.iter().sum::<i64>() as f64 / rtts.len() as f64);
            (rtts.iter().copied().max(), mean, done)
        };
        if !done {
            let w = cfg.wait.duration(max_rtt, mean_rtt);
            let t0 = mono_ns();
            let deadline = t0 + w.as_nanos().min(i64::MAX as u128 / 2) as i64;
            while mono_ns() < deadline && !cancel.load(Ordering::Relaxed) {
                {
                    let g = shared.lock().unwrap();
                    if g.rts.iter().all(|r| r.received()) || g.server_closed {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            run.wait_ns = mono_ns() - t0;
        }
    }
    stop_rx.store(true, Ordering::Relaxed);
    let _ = receiver.join();
    run.duration_ns = mono_ns() - start_mono;
    let server_closed = shared.lock().unwrap().server_closed;
    if !server_closed {
        close(token);
    }
    let mut g = shared.lock().unwrap();
    run.round_trips = std::mem::take(&mut g.rts);
    run.counters = std::mem::take(&mut g.counters);
    run.rejected = std::mem::take(&mut g.rejected);
    run.kernel_rx_stamps = g.kernel_rx_stamps;
    run.server_closed = server_closed;
    run.receive_error = g.receive_error.take();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(
            split_host_port("10.0.0.1").unwrap(),
            ("10.0.0.1".into(), 2112)
        );
        assert_eq!(
            split_host_port("10.0.0.1:99").unwrap(),
            ("10.0.0.1".into(), 99)
        );
        assert_eq!(
            split_host_port("[fd77::2]:5").unwrap(),
            ("fd77::2".into(), 5)
        );
        assert_eq!(
            split_host_port("[fd77::2]").unwrap(),
            ("fd77::2".into(), 2112)
        );
        assert_eq!(
            split_host_port("fd77::2").unwrap(),
            ("fd77::2".into(), 2112)
        );
        assert!(split_host_port("h:port").is_err());
    }

    #[test]
    fn wait_forms() {
        assert_eq!(
            Wait::parse("3x4s").unwrap(),
            Wait::MaxRtt(3.0, Duration::from_secs(4))
        );
        assert_eq!(
            Wait::parse("2r500ms").unwrap(),
            Wait::MeanRtt(2.0, Duration::from_millis(500))
        );
        assert_eq!(
            Wait::parse("1500ms").unwrap(),
            Wait::Fixed(Duration::from_millis(1500))
        );
        assert!(Wait::parse("x").is_err());
        let w = Wait::MaxRtt(3.0, Duration::from_secs(4));
        assert_eq!(w.duration(Some(1000), None), Duration::from_nanos(3000));
        assert_eq!(w.duration(None, None), Duration::from_secs(4));
    }

    #[test]
    fn restrictions_are_named() {
        let want = IrttConfig {
            interval: Duration::from_millis(5),
            ..Default::default()
        }
        .requested_params();
        let mut got = want.clone();
        got.interval_ns = 10_000_000;
        got.stamp_at = StampAt::Midpoint;
        let r = check_params(&want, &got).unwrap();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[0].contains("interval from 5ms to 10ms"), "{r:?}");
        assert!(r[1].contains("timestamps from both to midpoint"), "{r:?}");
        got.protocol_version = 2;
        assert!(check_params(&want, &got)
            .unwrap_err()
            .to_string()
            .contains("protocol version 2"));
        let mut longer = want.clone();
        longer.duration_ns *= 2;
        assert!(check_params(&want, &longer).is_err());
    }

    #[test]
    fn round_trip_bound() {
        let c = IrttConfig {
            server: "x".into(),
            duration: Duration::from_secs(3600),
            interval: Duration::from_millis(10),
            ..Default::default()
        };
        assert_eq!(expected_round_trips(c.duration, c.interval), 360_001);
        c.validate().unwrap();
        let huge = IrttConfig {
            interval: Duration::from_micros(1),
            ..c
        };
        assert!(huge.validate().is_err());
    }
}
