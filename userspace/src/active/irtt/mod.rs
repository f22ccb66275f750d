//! The irtt probe: isochronous UDP round trips against an `irtt server`,
//! speaking irtt's wire protocol (version 1, irtt 0.9.x).
//!
//! - [`packet`]: packet encode/decode (magic, flags, token, seqno, HMAC-MD5,
//!   received stats, timestamps).
//! - [`params`]: the parameters negotiated in the open handshake.
//! - [`client`]: handshake, sender, receiver, wait, close.
//! - [`stats`]: irtt's statistics from a compact 72-byte per-round-trip record.
//! - [`output`]: the text summary.
//!
//! Library use (e.g. `compare`): build an [`IrttConfig`] and call [`run_irtt`].
pub mod client;
pub mod output;
pub mod packet;
pub mod params;
pub mod stats;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

pub use client::{Df, Fill, IpVersion, IrttConfig, IrttReplyHook, Rejected, Wait};
pub use params::{Clock, Params, ReceivedStats, StampAt};
pub use stats::{Lost, Stats};

/// `rttscope probe irtt`: flags follow `irtt client` (same names and defaults).
#[derive(Debug, Clone, Args)]
pub struct IrttArgs {
    /// The irtt server: HOST, HOST:PORT, [IPV6] or [IPV6]:PORT (port 2112 if none is given).
    pub server: String,
    /// Send interval (a duration with a unit, as irtt takes it: 10ms, 1s).
    #[arg(short = 'i', long, value_name = "DURATION", default_value = "1s", value_parser = crate::analysis::units::duration_arg)]
    pub interval: Duration,
    /// Total time to send, a duration with a unit (irtt's 1m is written 1min: a lone m is refused as ambiguous).
    #[arg(short = 'd', long, value_name = "DURATION", default_value = "1min", value_parser = crate::analysis::units::duration_arg)]
    pub duration: Duration,
    /// Packet length including irtt headers (0: as small as the headers allow).
    #[arg(short = 'l', long, default_value_t = 0)]
    pub length: usize,
    /// Server statistics on received packets (count: loss split up/down; window: per packet).
    #[arg(long, value_enum, default_value = "both")]
    pub stats: ReceivedStats,
    /// Server timestamps.
    #[arg(long, value_enum, default_value = "both")]
    pub tstamp: StampAt,
    /// Server clocks in the timestamps.
    #[arg(long, value_enum, default_value = "both")]
    pub clock: Clock,
    /// ToS/traffic-class byte, as irtt takes it (0x for hex; EF is 0xb8).
    #[arg(long, default_value = "0", value_parser = parse_byte)]
    pub dscp: u8,
    /// Payload fill: none, rand, pattern or pattern:HEX (the pattern without HEX: 69727474, "irtt").
    #[arg(long, default_value = "none", value_parser = parse_fill)]
    pub fill: Fill,
    /// Fill only once and repeat for all packets.
    #[arg(long)]
    pub fill_one: bool,
    /// Ask the server to fill its replies (e.g. rand); the server must allow it.
    #[arg(long)]
    pub sfill: Option<String>,
    /// HMAC-MD5 key for all packets (0x for hex).
    #[arg(long)]
    pub hmac: Option<String>,
    /// Open timeouts, comma separated (each at least 200ms).
    #[arg(long, default_value = "1s,2s,4s,8s")]
    pub timeouts: String,
    /// Wait for late replies at the end: #xDUR (times max RTT), #rDUR (times mean RTT) or DUR.
    #[arg(long, default_value = "3x4s", value_parser = Wait::parse)]
    pub wait: Wait,
    /// IP TTL / hop limit (0: OS default).
    #[arg(long, default_value_t = 0)]
    pub ttl: u32,
    /// Do-not-fragment bit: default (OS), false, true.
    #[arg(long, value_enum, default_value = "default")]
    pub df: Df,
    /// IPv4 only.
    #[arg(short = '4', conflicts_with = "ipv6")]
    pub ipv4: bool,
    /// IPv6 only.
    #[arg(short = '6')]
    pub ipv6: bool,
    /// Quiet, as irtt's -q: no line per packet (nor, with --json, a progress line); the results only.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Local address: :PORT, HOST or HOST:PORT.
    #[arg(long)]
    pub local: Option<String>,
    /// Accept parameters the server restricted instead of failing.
    #[arg(long)]
    pub loose: bool,
    /// Only open and validate parameters with the server; send no test packets.
    #[arg(short = 'n', long = "no-test")]
    pub no_test: bool,
    /// Write irtt's detailed JSON to FILE, as `irtt client -o` (`-`: standard output): settings,
    /// statistics and every round trip (`offset_ns`, `rtt_ns`, `lost`), the shape `compare` uses.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub out: crate::cmd::probe::OutputOpts,
}

fn parse_byte(s: &str) -> Result<u8, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16),
        None => s.parse::<u8>(),
    };
    v.map_err(|_| format!("'{s}' is not a byte value (0-255, or 0x00-0xff)"))
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("'{s}' is not an even number of hex digits"));
    }
    Ok((0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect())
}

fn parse_fill(s: &str) -> Result<Fill, String> {
    match s {
        "none" => Ok(Fill::None),
        "rand" => Ok(Fill::Rand),
        "pattern" => Ok(Fill::Pattern(b"irtt".to_vec())),
        _ => match s.strip_prefix("pattern:") {
            Some(h) => parse_hex(h).map(Fill::Pattern),
            None => Err(format!(
                "'{s}' is not a fill: use none, rand, pattern or pattern:HEX"
            )),
        },
    }
}

/// irtt's key syntax: `0x` followed by hex, else the bytes of the string.
pub fn parse_key(s: &str) -> Result<Vec<u8>> {
    let k = match s.strip_prefix("0x") {
        Some(h) => parse_hex(h).map_err(anyhow::Error::msg)?,
        None => s.as_bytes().to_vec(),
    };
    if k.is_empty() {
        bail!("the HMAC key is empty");
    }
    Ok(k)
}

impl IrttArgs {
    pub fn to_config(&self) -> Result<IrttConfig> {
        let open_timeouts = self
            .timeouts
            .split(',')
            .map(|t| crate::analysis::units::parse_duration(t.trim()).map_err(anyhow::Error::from))
            .collect::<Result<Vec<_>>>()
            .context("--timeouts")?;
        let hmac_key = self.hmac.as_deref().map(parse_key).transpose()?;
        Ok(IrttConfig {
            server: self.server.clone(),
            duration: self.duration,
            interval: self.interval,
            length: self.length,
            received_stats: self.stats,
            stamp_at: self.tstamp,
            clock: self.clock,
            dscp: self.dscp,
            fill: self.fill.clone(),
            fill_one: self.fill_one,
            server_fill: self.sfill.clone(),
            hmac: hmac_key.is_some(),
            hmac_key,
            open_timeouts,
            wait: self.wait,
            ttl: self.ttl,
            df: self.df,
            ip_version: match (self.ipv4, self.ipv6) {
                (true, _) => IpVersion::V4,
                (_, true) => IpVersion::V6,
                _ => IpVersion::Any,
            },
            local: self.local.clone(),
            loose: self.loose,
            no_test: self.no_test,
            on_reply: None,
        })
    }
}

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
        let raw = client::run_blocking(&cfg, cancel)?;
        Ok(build_result(cfg, raw))
    })
    .await
    .context("irtt probe task")?
}

fn build_result(cfg: IrttConfig, raw: client::RawRun) -> IrttResult {
    let stats = stats::compute(&raw.round_trips, &raw.counters, raw.negotiated.interval_ns);
    let lost = stats::lost_directions(&raw.round_trips);
    let samples = raw
        .round_trips
        .iter()
        .zip(lost)
        .map(|(rt, lost)| IrttSample {
            offset_ns: rt.send_mono,
            rtt_ns: rt.rtt(),
            lost,
        })
        .collect();
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
    let rx_kind = if raw.kernel_rx_stamps > 0 {
        format!(
            "kernel SO_TIMESTAMPNS for {} of {} replies, mapped to CLOCK_MONOTONIC",
            raw.kernel_rx_stamps, stats.replies_unique
        )
    } else {
        "userspace clock after recvmsg".to_string()
    };
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

/// The text (or CSV), the result document (`--json`) and irtt's JSON (`-o`). With `-o -` or
/// `--json -` standard output carries that JSON alone, and the text goes to stderr.
fn write_output(args: &IrttArgs, result: &IrttResult) -> Result<()> {
    let irtt_to_stdout = args.output.as_deref() == Some(std::path::Path::new("-"));
    anyhow::ensure!(
        !(irtt_to_stdout && args.out.json_to_stdout()),
        "-o - and --json - both want standard output: give one of them a FILE"
    );
    let doc = output::document(result);
    if irtt_to_stdout {
        eprint!("{}", output::text(result));
        if let Some(p) = &args.out.json {
            doc.write_to(p)?;
        }
    } else {
        args.out.emit(&doc, &output::text(result))?;
    }
    if let Some(path) = &args.output {
        let json = serde_json::to_string_pretty(result)? + "\n";
        if irtt_to_stdout {
            use std::io::Write;
            std::io::stdout().write_all(json.as_bytes())?;
        } else {
            crate::sys::files::write_atomically(path, json.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
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

/// The CLI entry point.
pub fn run(args: IrttArgs) -> Result<()> {
    let mut cfg = args.to_config()?;
    // A line per packet on stdout, as irtt, unless -q, or standard output carries a document
    // (`-o -`, `--json -`) or CSV: a progress line on a terminal instead.
    let stdout_is_data = args.out.json_to_stdout()
        || args.output.as_deref() == Some(std::path::Path::new("-"))
        || args.out.format == crate::cmd::probe::PrintFormat::Csv;
    let per_packet = !args.quiet && !stdout_is_data;
    if per_packet {
        cfg.on_reply = Some(IrttReplyHook(Arc::new(|seq, rt, prev| {
            println!("{}", packet_line(seq, rt, prev));
        })));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let cancel = Arc::new(AtomicBool::new(false));
    let live = crate::sinks::progress::Live::start(
        args.quiet || per_packet,
        format!("probe irtt {}", args.server),
        (!args.no_test).then_some(args.duration),
        None,
    );
    let result = rt.block_on(async {
        let c = cancel.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
            }
            c.store(true, Ordering::Relaxed);
        });
        run_irtt(cfg, cancel.clone()).await
    })?;
    drop(live);
    write_output(&args, &result)?;
    // partial results are printed above; the exit status says the test broke
    if let Some(e) = &result.send_error {
        let hint = if e.contains("os error 90") {
            format!(
                " (the {}-byte packets exceed the path MTU with --df true)",
                result.settings.packet_length
            )
        } else {
            String::new()
        };
        bail!("the test stopped on a send error: {e}{hint}");
    }
    if let Some(e) = &result.receive_error {
        bail!("the test stopped on a receive error: {e}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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

    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: IrttArgs,
    }

    #[test]
    fn defaults_follow_irtt() {
        let t = T::try_parse_from(["x", "10.0.0.2"]).unwrap();
        let c = t.a.to_config().unwrap();
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.duration, Duration::from_secs(60));
        assert_eq!(c.open_timeouts.len(), 4);
        assert_eq!(c.received_stats, ReceivedStats::Both);
        assert_eq!(c.stamp_at, StampAt::Both);
        assert!(!c.hmac);
    }

    #[test]
    fn flags_parse() {
        let t = T::try_parse_from([
            "x",
            "[fd77::2]:2113",
            "-i",
            "10ms",
            "-d",
            "5s",
            "-l",
            "172",
            "--fill",
            "pattern:abcd",
            "--tstamp",
            "midpoint",
            "--clock",
            "monotonic",
            "--stats",
            "count",
            "--dscp",
            "0xb8",
            "--hmac",
            "0x0102",
            "-6",
        ])
        .unwrap();
        let c = t.a.to_config().unwrap();
        assert_eq!(c.fill, Fill::Pattern(vec![0xab, 0xcd]));
        assert_eq!(c.stamp_at, StampAt::Midpoint);
        assert_eq!(c.clock, Clock::Monotonic);
        assert_eq!(c.dscp, 0xb8);
        assert_eq!(c.hmac_key, Some(vec![1, 2]));
        assert_eq!(c.ip_version, IpVersion::V6);
        assert!(T::try_parse_from(["x", "h", "--fill", "zeros"]).is_err());
        assert!(T::try_parse_from(["x", "h", "--dscp", "300"]).is_err());
        assert!(T::try_parse_from(["x", "h", "-4", "-6"]).is_err());
        let bad = T::try_parse_from(["x", "h", "--timeouts", "1s,100ms"]).unwrap();
        assert!(bad.a.to_config().unwrap().validate().is_err());
    }

    #[test]
    fn key_syntax() {
        assert_eq!(parse_key("secret").unwrap(), b"secret");
        assert_eq!(parse_key("0xff00").unwrap(), vec![0xff, 0]);
        assert!(parse_key("0xf").is_err());
    }
}
