//! What a request/response probe returns: the settings it ran with, its
//! counts, summary and samples ([`ProbeResult`]), and what identifies its
//! packets ([`ProbeIdent`]).
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::config::{IoMode, Kind};
use crate::analysis::stats::{NetperfPercentiles, Summary};

/// The settings of a run, recorded with its result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    pub kind: Kind,
    pub target: String,
    pub address: IpAddr,
    pub port: u16,
    pub interval_ns: u64,
    pub burst: u32,
    /// Bytes actually sent per request / expected per response (UDP and ICMP
    /// raise small sizes to their 16-byte header; ICMP sizes are the echo payload).
    pub req_size: u32,
    pub resp_size: u32,
    pub duration_s: Option<f64>,
    pub count: Option<u64>,
    /// The pacing wait spins (`--spin`, netperf's `--enable-spin`).
    pub spin: bool,
    /// The reply is busy-polled (`--busy-poll`) instead of waited for asleep.
    #[serde(default)]
    pub busy_poll: bool,
    pub nodelay: bool,
    pub timeout_ns: u64,
    /// How the time between bursts is waited: "none (back to back)", "spin",
    /// "sleep (timerfd)" (in the reactor) or "sleep (clock_nanosleep)" (TCP_RR's blocking thread).
    pub pacing: String,
    /// How the RTT is timed. TCP_RR and UDP_RR: "CLOCK_MONOTONIC" (userspace,
    /// around the send and receive calls). tcp-connect: the kernel's handshake
    /// RTT (`tcpi_rtt`), userspace for a handshake whose SYN was sent again. ICMP: "kernel rx timestamp
    /// (SO_TIMESTAMPNS), realtime send stamp" when replies carried the kernel's
    /// receive time (as in ping), "userspace monotonic" when none did
    /// (see `counts.rx_timestamp_fallbacks`).
    pub clock: String,
    /// ICMP only: "dgram" or "raw".
    pub icmp_socket: Option<String>,
    /// How the transactions' I/O was done.
    pub io: IoMode,
    /// ICMP: the requests' TTL or hop limit when one was asked for (`-t`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u8>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    pub sent: u64,
    /// Replies received within the timeout (one per transaction).
    pub received: u64,
    /// Transactions without a reply within the timeout (includes those whose reply came late).
    pub lost: u64,
    /// Replies that arrived after their transaction had timed out.
    pub late: u64,
    /// Second and further replies to the same request.
    pub duplicates: u64,
    /// Replies older than the newest reply already received.
    pub reordered: u64,
    /// Send/receive errors (e.g. connection refused).
    pub errors: u64,
    /// Datagrams that were not replies to us (bad header, foreign ICMP).
    pub foreign: u64,
    /// Samples not kept in `samples` because of `max_samples`.
    pub samples_dropped: u64,
    /// ICMP: replies timed in userspace (CLOCK_MONOTONIC) because no kernel
    /// receive timestamp came with them, or it was inconsistent (a realtime
    /// clock step between send and receive). `tcp-connect`: handshakes timed in
    /// userspace (connect() to writable) because the kernel had no sample of the
    /// first SYN (it was sent again).
    #[serde(default)]
    pub rx_timestamp_fallbacks: u64,
    /// UDP: requests sent again because the server answered with a new cookie
    /// instead of the (larger) response (see `framing.rs`); the transaction is
    /// timed from the second send.
    #[serde(default)]
    pub cookie_refreshes: u64,
    /// `tcp-connect`: handshakes answered by a reset (nothing listens: "Connection refused");
    /// each is also an error and lost.
    #[serde(default)]
    pub refused: u64,
    /// `tcp-connect`: SYNs the kernel sent again (no SYN-ACK within its retransmission timer, 1 s
    /// then doubling), summed over the handshakes; a handshake that needed one is timed from the
    /// first SYN, as tcping's.
    #[serde(default)]
    pub syn_retransmits: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeResult {
    pub settings: Settings,
    /// Wall-clock start, seconds since the Unix epoch (for humans; every
    /// duration is from CLOCK_MONOTONIC, except ICMP RTTs: `settings.clock`).
    pub start_unix_s: f64,
    /// From the first send to the end of the last transaction.
    pub elapsed_s: f64,
    /// The run's length, what `throughput` divides by: `-l` for a run that
    /// reached its end (netperf's definition), else (`-n COUNT`, cancelled,
    /// failed) `elapsed_s`.
    #[serde(default)]
    pub run_s: f64,
    pub counts: Counts,
    /// RTT summary in microseconds.
    pub summary: Summary,
    /// "exact" (from every sample) or "hdr" (HDR histogram, when samples were dropped).
    pub summary_source: String,
    /// P50/P90/P99 from a netperf-style histogram, whole microseconds.
    pub netperf: NetperfPercentiles,
    /// Transactions (replies received) per second of the run: `counts.received / run_s`.
    pub throughput: f64,
    pub throughput_units: String,
    /// Per transaction: (offset of the send from the start, RTT), nanoseconds.
    pub samples: Vec<(u64, u64)>,
    /// Last error seen, if any.
    pub last_error: Option<String>,
    /// What identifies this probe's packets, and its window (not saved: `compare` selects the
    /// passive views' samples with it).
    #[serde(skip)]
    pub ident: ProbeIdent,
}

/// What identifies one probe's packets to the passive views, and when it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeIdent {
    /// TCP_RR and UDP_RR: the probe socket's own address (`getsockname`); with the target's
    /// address it is the 4-tuple of every packet of the probe.
    pub local: Option<SocketAddr>,
    /// ICMP: the echo identifier (a datagram socket's "port", or the raw socket's own).
    pub icmp_id: Option<u16>,
    /// The first transaction's send (CLOCK_MONOTONIC, ns).
    pub start_mono_ns: u64,
    /// The end of the last transaction (CLOCK_MONOTONIC, ns).
    pub end_mono_ns: u64,
}

impl ProbeIdent {
    /// Whether a monotonic time falls inside the probe's window.
    pub fn in_window(&self, ts_ns: u64) -> bool {
        ts_ns >= self.start_mono_ns && ts_ns <= self.end_mono_ns
    }
}
