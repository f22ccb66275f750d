//! The irtt probe: isochronous UDP round trips against an `irtt server`,
//! speaking irtt's wire protocol (version 1, irtt 0.9.x).
//!
//! - [`packet`]: packet encode/decode (magic, flags, token, seqno, HMAC-MD5,
//!   received stats, timestamps).
//! - [`params`]: the parameters negotiated in the open handshake.
//! - [`client`]: the test's configuration and the checks of what the server granted.
//! - [`run`]: handshake, sender, receiver, wait, close (`socket.rs`: the socket).
//! - [`stats`]: irtt's statistics from a compact 72-byte per-round-trip record.
//! - [`output`]: the text summary.
//!
//! Library use (e.g. `compare`): build an [`IrttConfig`] and call [`run_irtt`].
//! The command (`rttscope probe irtt`, its flags and output) is `cmd::probe::irtt`.
pub mod client;
pub mod output;
pub mod packet;
pub mod params;
pub mod run;
mod socket;
pub mod stats;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub use client::{Df, Fill, IpVersion, IrttConfig, IrttReplyHook, Rejected, Wait};
pub use params::{Clock, Params, ReceivedStats, StampAt};
pub use stats::{Lost, Stats};

/// Settings of a run: as supplied, and as negotiated with the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IrttSettings {
    pub supplied: IrttConfig,
    pub local_addr: String,
    pub remote_addr: String,
    /// What the server granted (irtt's `config.params`).
    pub negotiated: Params,
    /// Restrictions the server imposed (accepted with `--loose`).
    pub restrictions: Vec<String>,
    /// UDP payload length of every request and reply.
    pub packet_length: usize,
    /// How replies were timestamped on arrival.
    pub receive_timestamps: String,
    /// How the sender waits for each send time.
    pub send_timer: String,
}

/// One round trip, compactly: send offset from the test start and RTT (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrttSample {
    pub offset_ns: i64,
    pub rtt_ns: Option<i64>,
    pub lost: Lost,
}

/// The result of one irtt probe run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IrttResult {
    pub probe: String,
    pub settings: IrttSettings,
    pub start_unix_ns: i64,
    /// From just before the first send to the end of the wait.
    pub duration_ns: i64,
    pub wait_ns: i64,
    pub interrupted: bool,
    pub server_closed: bool,
    pub send_error: Option<String>,
    pub receive_error: Option<String>,
    pub stats: Stats,
    pub rejected: Rejected,
    /// Caveats a reader needs (clock synchronisation, restrictions, errors).
    pub notes: Vec<String>,
    /// Per round trip, indexed by seqno.
    pub samples: Vec<IrttSample>,
}

impl IrttResult {
    /// (send offset from the test start, RTT) in ns of every answered round
    /// trip, in seqno order: what `compare` plots next to the other views.
    pub fn rtt_samples(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.samples
            .iter()
            .filter_map(|s| s.rtt_ns.map(|r| (s.offset_ns, r)))
    }
}

/// Run an irtt test. Setting `cancel` ends it early (partial results).
pub async fn run_irtt(cfg: IrttConfig, cancel: Arc<AtomicBool>) -> Result<IrttResult> {
    tokio::task::spawn_blocking(move || {
        let raw = run::run_blocking(&cfg, cancel)?;
        Ok(build_result(cfg, raw))
    })
    .await
    .context("irtt probe task")?
}

fn build_result(cfg: IrttConfig, raw: run::RawRun) -> IrttResult {
    let stats = stats::compute(&raw.round_trips, &raw.counters, raw.negotiated.interval_ns);
    let samples = samples(&raw.round_trips);
    let notes = notes(&cfg, &raw, &stats);
    let rx_kind = receive_timestamps(&raw, &stats);
    IrttResult {
        probe: "irtt".into(),
        settings: IrttSettings {
            local_addr: raw.local_addr.to_string(),
            remote_addr: raw.remote_addr.to_string(),
            negotiated: raw.negotiated,
            restrictions: raw.restrictions,
            packet_length: raw.packet_length,
            receive_timestamps: rx_kind,
            send_timer: "clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) on a dedicated thread; send times stamped in userspace just before send()".into(),
            supplied: cfg,
        },
        start_unix_ns: raw.start_wall_ns,
        duration_ns: raw.duration_ns,
        wait_ns: raw.wait_ns,
        interrupted: raw.interrupted,
        server_closed: raw.server_closed,
        send_error: raw.send_error,
        receive_error: raw.receive_error,
        stats,
        rejected: raw.rejected,
        notes,
        samples,
    }
}

/// Per round trip (indexed by seqno): send offset, RTT and lost direction.
fn samples(round_trips: &[stats::RoundTrip]) -> Vec<IrttSample> {
    let lost = stats::lost_directions(round_trips);
    round_trips
        .iter()
        .zip(lost)
        .map(|(rt, lost)| IrttSample {
            offset_ns: rt.send_mono,
            rtt_ns: rt.rtt(),
            lost,
        })
        .collect()
}

/// The caveats a reader needs: clock synchronisation, truncated replies,
/// `--stats none`, accepted restrictions, a server that closed.
fn notes(cfg: &IrttConfig, raw: &run::RawRun, stats: &Stats) -> Vec<String> {
    let mut notes = Vec::new();
    if stats.send_delay.n > 0 || stats.receive_delay.n > 0 {
        notes.push(
            "one-way send/receive delays compare the client's and the server's wall clocks: they are meaningful only if both clocks are synchronised (same host, or PTP/NTP to well below the delays measured); RTT and IPDV do not depend on it"
                .to_string(),
        );
        if stats.negative_one_way_delays > 0 {
            notes.push(format!(
                "{} one-way delays came out negative: the client and server clocks are NOT synchronised, ignore the one-way delays",
                stats.negative_one_way_delays
            ));
        }
    }
    if raw.rejected.truncated > 0 {
        notes.push(format!(
            "{} replies were shorter than our {}-byte requests and were rejected (an irtt server answers at most its interface MTU: keep -l within the path MTU minus IP/UDP headers, e.g. 1472 for IPv4 on a 1500 MTU)",
            raw.rejected.truncated, raw.packet_length
        ));
    }
    if raw.negotiated.received_stats == ReceivedStats::None {
        notes.push("--stats none: loss cannot be split into upstream and downstream".to_string());
    }
    for r in &raw.restrictions {
        notes.push(format!("accepted (--loose): {r}"));
    }
    if raw.server_closed && !cfg.no_test {
        notes.push("the server closed the connection (its duration limit?)".to_string());
    }
    notes
}

/// How replies were timestamped on arrival (kernel stamps or userspace clock).
fn receive_timestamps(raw: &run::RawRun, stats: &Stats) -> String {
    if raw.kernel_rx_stamps > 0 {
        format!(
            "kernel SO_TIMESTAMPNS for {} of {} replies, mapped to CLOCK_MONOTONIC",
            raw.kernel_rx_stamps, stats.replies_unique
        )
    } else {
        "userspace clock after recvmsg".to_string()
    }
}

/// irtt's line per packet: `seq=3 rtt=152µs rd=45.6µs sd=106µs ipdv=12.6µs`
/// (RTT without the server's processing time, the one-way delays, which
/// need synchronised clocks, and the RTT's change from the previous seqno).
pub fn packet_line(seq: u32, rt: &stats::RoundTrip, prev: Option<&stats::RoundTrip>) -> String {
    let d = |v: Option<i64>| v.map_or("n/a".to_string(), go_duration);
    let rtt = rt.rtt();
    let ipdv = rtt
        .zip(prev.and_then(|p| p.rtt()))
        .map(|(a, b)| (a - b).abs());
    format!(
        "seq={seq} rtt={} rd={} sd={} ipdv={}",
        d(rtt),
        d(rt.receive_delay()),
        d(rt.send_delay()),
        d(ipdv)
    )
}

/// A duration as irtt prints it: three significant digits, Go's units
/// (`76.3µs`, `140µs`, `1.06ms`, `2.5s`).
pub fn go_duration(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "" };
    let a = ns.unsigned_abs() as f64;
    let (v, unit) = match a {
        a if a < 1e3 => return format!("{sign}{a}ns"),
        a if a < 1e6 => (a / 1e3, "µs"),
        a if a < 1e9 => (a / 1e6, "ms"),
        a => (a / 1e9, "s"),
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    format!("{sign}{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irtt_style_durations_and_packet_lines() {
        assert_eq!(go_duration(76_300), "76.3µs");
        assert_eq!(go_duration(140_049), "140µs");
        assert_eq!(go_duration(1_064_000), "1.06ms");
        assert_eq!(go_duration(999), "999ns");
        assert_eq!(go_duration(2_500_000_000), "2.5s");
        assert_eq!(go_duration(-12_600), "-12.6µs");
        let mut a = stats::RoundTrip::sent(0, 1_000_000_000);
        a.raw_rtt = 150_000;
        a.srv_recv_wall = 1_000_100_000;
        a.srv_send_wall = 1_000_110_000;
        let mut b = stats::RoundTrip::sent(10_000_000, 1_010_000_000);
        b.raw_rtt = 120_000;
        // no server stamps on b: no one-way delays, its raw RTT
        assert_eq!(
            packet_line(1, &b, Some(&a)),
            "seq=1 rtt=120µs rd=n/a sd=n/a ipdv=20µs"
        );
        assert_eq!(
            packet_line(0, &a, None),
            "seq=0 rtt=140µs rd=40µs sd=100µs ipdv=n/a"
        );
    }
}
