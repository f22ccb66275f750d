//! The irtt client's configuration (as `irtt client` takes it), the server
//! address, the rejected-packet counters, and the checks of what the server
//! granted in the open handshake. The test itself runs in `run.rs`.
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::packet::PacketError;
use super::params::{Clock, Params, ReceivedStats, StampAt, PROTOCOL_VERSION};
use super::stats::{RoundTrip, MAX_ROUND_TRIPS};

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

    pub(super) fn duration(&self, max_rtt: Option<i64>, mean_rtt: Option<f64>) -> Duration {
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
    check_duration(want, got, &mut r)?;
    check_interval(want, got, &mut r)?;
    check_length(want, got, &mut r)?;
    other_restrictions(want, got, &mut r);
    Ok(r)
}

/// The duration: the server may shorten it (a restriction in `r`), never lengthen it.
fn check_duration(want: &Params, got: &Params, r: &mut Vec<String>) -> Result<()> {
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
    Ok(())
}

/// The interval: there must be one; the server may lengthen it, and shorten it (both
/// restrictions in `r`) only to 1 s or more.
fn check_interval(want: &Params, got: &Params, r: &mut Vec<String>) -> Result<()> {
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
    Ok(())
}

/// The packet length: the server may shorten it (a restriction in `r`), never lengthen it.
fn check_length(want: &Params, got: &Params, r: &mut Vec<String>) -> Result<()> {
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
    Ok(())
}

/// The changes the server may make to the received stats, timestamps, clocks, DSCP and fill:
/// each one a restriction in `r`.
fn other_restrictions(want: &Params, got: &Params, r: &mut Vec<String>) {
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
