//! `rttscope probe irtt`: flags follow `irtt client` (same names and defaults),
//! parsed into an [`IrttConfig`], run with [`run_irtt`], and printed.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::output_opts::{OutputOpts, PrintFormat};
use crate::active::irtt::{
    output, packet_line, run_irtt, Clock, Df, Fill, IpVersion, IrttConfig, IrttReplyHook,
    IrttResult, ReceivedStats, StampAt, Wait,
};

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
    pub out: OutputOpts,
}

pub(crate) fn parse_byte(s: &str) -> Result<u8, String> {
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

pub(crate) fn parse_fill(s: &str) -> Result<Fill, String> {
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

/// The CLI entry point.
pub fn run(args: IrttArgs) -> Result<()> {
    let mut cfg = args.to_config()?;
    // A line per packet on stdout, as irtt, unless -q, or standard output carries a document
    // (`-o -`, `--json -`) or CSV: a progress line on a terminal instead.
    let stdout_is_data = args.out.json_to_stdout()
        || args.output.as_deref() == Some(std::path::Path::new("-"))
        || args.out.format == PrintFormat::Csv;
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
