//! What a request/response probe is asked to do: its kind, target, pacing,
//! sizes, stop condition and I/O mode ([`ProbeConfig`]), and the hooks told of
//! every reply as it arrives.
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::icmp::DEFAULT_PAYLOAD;
use super::serve::DEFAULT_PORT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    TcpRr,
    UdpRr,
    Icmp,
    /// Timed TCP handshakes (tcping, `hping3 -S`, netperf's TCP_CC): no responder, no data.
    TcpConnect,
}

impl Kind {
    /// netperf's / ping's name for the test.
    pub fn label(self) -> &'static str {
        match self {
            Kind::TcpRr => "TCP_RR",
            Kind::UdpRr => "UDP_RR",
            Kind::Icmp => "ICMP_ECHO",
            Kind::TcpConnect => "TCP_CONNECT",
        }
    }
}

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Start no transaction after this long.
    Duration(Duration),
    /// After this many transactions.
    Count(u64),
    /// After this many transactions, or this long, whichever comes first
    /// (ping's `-c` with `-w`).
    CountOrDuration(u64, Duration),
}

/// Called with (sequence number, RTT in ns) for every reply as it arrives:
/// ping's line per reply. The sequence number is the request's (ICMP, UDP)
/// or the transaction's (TCP), counted from 1.
#[derive(Clone)]
pub struct ReplyHook(pub(crate) std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>);

impl ReplyHook {
    pub fn new(f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        ReplyHook(std::sync::Arc::new(f))
    }
}

/// What ping (ICMP) or tcping (`tcp-connect`) prints per request, as it is answered or given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeLine {
    /// An answer (an echo reply, a completed handshake): its sequence, RTT (ns) and TTL or hop
    /// limit, if the kernel gave it.
    Reply {
        seq: u64,
        rtt_ns: u64,
        ttl: Option<u8>,
    },
    /// An ICMP error about request `seq` (its 16-bit ICMP sequence when it is not the one
    /// waiting), from `from`, in ping's words.
    Error {
        seq: u64,
        from: std::net::IpAddr,
        text: String,
    },
    /// Request `seq` failed (its send or its handshake: "Connection refused").
    Failed { seq: u64, text: String },
    /// No answer to request `seq` within the timeout.
    TimedOut { seq: u64 },
}

/// Called with every [`ProbeLine`] (ICMP and `tcp-connect`: the line per request).
#[derive(Clone)]
pub struct LineHook(pub(crate) std::sync::Arc<dyn Fn(&ProbeLine) + Send + Sync>);

impl LineHook {
    pub fn new(f: impl Fn(&ProbeLine) + Send + Sync + 'static) -> Self {
        LineHook(std::sync::Arc::new(f))
    }
}

impl std::fmt::Debug for LineHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LineHook")
    }
}

impl std::fmt::Debug for ReplyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyHook")
    }
}

/// How the TCP_RR hot loop does its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// Blocking send()/recv() on a dedicated thread (`spawn_blocking`), as
    /// netperf does: the fewest system calls and wake-ups per transaction.
    BlockingThread,
    /// Non-blocking sockets driven by the tokio reactor (EAGAIN, epoll_wait, wake).
    TokioReactor,
}

#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub kind: Kind,
    /// Host name or address as given.
    pub target: String,
    /// The responder's port (TCP/UDP; ignored for ICMP).
    pub port: u16,
    /// Time between the starts of bursts; zero = back to back.
    pub interval: Duration,
    /// Transactions per interval (one after the other).
    pub burst: u32,
    pub req_size: u32,
    pub resp_size: u32,
    pub stop: Stop,
    /// Wait for the next interval by spinning on the clock instead of
    /// sleeping (netperf's `--enable-spin`). The reply is still waited for
    /// in a blocking receive, as netperf does.
    pub spin: bool,
    /// Wait for the reply by polling the socket (non-blocking receives in a
    /// loop) instead of sleeping in the kernel: no wake-up in the sample, one
    /// CPU busy. Not netperf's; ping does it at intervals under ~10 ms.
    pub busy_poll: bool,
    /// TCP_NODELAY on both ends (TCP).
    pub nodelay: bool,
    /// A reply not received within this long is lost (UDP, ICMP); a TCP
    /// transaction taking longer fails the run.
    pub timeout: Duration,
    /// Keep at most this many per-transaction samples (the summary then comes
    /// from the HDR histogram; counts and histograms still see every sample).
    pub max_samples: usize,
    /// TCP_RR only (UDP and ICMP always use the reactor). Default: blocking thread.
    pub io: IoMode,
    /// Told of every reply as it arrives (none by default).
    pub on_reply: Option<ReplyHook>,
    /// ICMP: told of every reply (with its TTL) and every ICMP error, for ping's lines.
    pub on_line: Option<LineHook>,
    /// ICMP: the requests' TTL or hop limit (ping's -t); None: the system's.
    pub ttl: Option<u8>,
}

impl ProbeConfig {
    pub fn new(kind: Kind, target: &str) -> Self {
        let (req, resp) = match kind {
            Kind::Icmp => (DEFAULT_PAYLOAD as u32, DEFAULT_PAYLOAD as u32),
            _ => (1, 1),
        };
        ProbeConfig {
            kind,
            target: target.to_string(),
            port: DEFAULT_PORT,
            interval: Duration::ZERO,
            burst: 1,
            req_size: req,
            resp_size: resp,
            stop: Stop::Duration(Duration::from_secs(10)),
            spin: false,
            busy_poll: false,
            nodelay: false,
            timeout: Duration::from_secs(1),
            max_samples: 1_000_000,
            io: IoMode::BlockingThread,
            on_reply: None,
            on_line: None,
            ttl: None,
        }
    }
}
