//! `rttscope probe tcp-rr|udp-rr|icmp|irtt HOST`: netperf/ping-style options
//! parsed into an [`crate::active::ProbeConfig`], run, and printed.
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use crate::active::cancel::{cancel_pair, on_signals, runtime};
use crate::active::{output, run_probe, IoMode, Kind, ProbeConfig, Stop, DEFAULT_PORT};
use crate::analysis::units::duration_arg;

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    #[command(subcommand)]
    pub kind: ProbeKind,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ProbeKind {
    /// TCP request/response (netperf TCP_RR) against `rttscope serve`.
    TcpRr {
        #[command(flatten)]
        common: ProbeOpts,
    },
    /// UDP request/response (netperf UDP_RR) against `rttscope serve`; lost requests time out (-W).
    UdpRr {
        #[command(flatten)]
        common: ProbeOpts,
    },
    /// ICMP echo (ping): datagram ICMP socket where allowed, raw socket otherwise.
    Icmp {
        #[command(flatten)]
        common: ProbeOpts,
    },
    /// Isochronous UDP probe speaking irtt's protocol, against any `irtt server`: RTT, one-way delays, IPDV, up/down loss.
    Irtt(crate::active::irtt::IrttArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ProbeOpts {
    /// Target host name or address.
    #[arg(value_name = "HOST")]
    pub host: String,
    /// Run for this many seconds (default 10, as netperf).
    #[arg(
        short = 'l',
        long = "length",
        value_name = "SECONDS",
        conflicts_with = "count"
    )]
    pub length: Option<f64>,
    /// Run this many transactions instead.
    #[arg(short = 'n', long = "count", value_name = "COUNT")]
    pub count: Option<u64>,
    /// Interval between bursts: 0 = back to back (default); 10ms, 250us, 1s; a bare
    /// number is milliseconds and netperf's `10m`/`50u` suffixes are accepted.
    #[arg(short = 'w', long = "interval", default_value = "0", value_parser = interval_arg, value_name = "INTERVAL")]
    pub interval: Duration,
    /// Transactions per interval, one after the other.
    #[arg(short = 'b', long = "burst", default_value_t = 1, value_name = "BURST")]
    pub burst: u32,
    /// Wait for the next interval by spinning on the clock (netperf --enable-spin) instead of sleeping.
    #[arg(long)]
    pub spin: bool,
    /// Request and response sizes in bytes (default 1,1; ICMP: payload size, default 56).
    #[arg(short = 'r', long = "sizes", value_parser = sizes_arg, value_name = "REQ,RESP")]
    pub sizes: Option<(u32, u32)>,
    /// Set TCP_NODELAY on both ends (TCP).
    #[arg(long)]
    pub nodelay: bool,
    /// The responder's port (rttscope serve's default: 7878).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// A reply not received within this long counts as lost (UDP, ICMP); a TCP transaction taking longer fails.
    #[arg(short = 'W', long = "timeout", default_value = "1s", value_parser = duration_arg, value_name = "DURATION")]
    pub timeout: Duration,
    /// netperf output selectors, comma-separated: MIN_LATENCY, MAX_LATENCY, MEAN_LATENCY,
    /// P50_LATENCY, P90_LATENCY, P99_LATENCY, STDDEV_LATENCY, THROUGHPUT, THROUGHPUT_UNITS
    /// (microseconds, transactions/s); prints a header line and a value line.
    #[arg(short = 'o', long = "output", value_name = "SELECTORS", value_parser = output::parse_selectors)]
    pub output: Option<output::Selectors>,
    /// With -o: P50/P90/P99 from the netperf-style histogram (whole us, as netperf prints) instead of exact.
    #[arg(long)]
    pub netperf_percentiles: bool,
    /// Print the whole result (settings, counts, summary, every sample) as JSON.
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// TCP: drive the transactions through the tokio reactor (non-blocking
    /// sockets, epoll) instead of blocking send()/recv() on a dedicated thread.
    #[arg(long)]
    pub async_io: bool,
    /// Keep at most this many per-transaction samples in the result.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub max_samples: usize,
}

/// `-w`: our durations, plus netperf's habits (bare number = ms, `m` = ms, `u` = us, -1 = none).
pub fn interval_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "-1" {
        return Ok(Duration::ZERO);
    }
    if let Ok(ms) = t.parse::<f64>() {
        if ms >= 0.0 && ms.is_finite() {
            return Ok(Duration::from_nanos((ms * 1e6).round() as u64));
        }
    }
    if let Some(n) = t.strip_suffix('u') {
        return crate::analysis::units::parse_duration(&format!("{n}us"))
            .map_err(|e| e.to_string());
    }
    if let Some(n) = t.strip_suffix('m') {
        if !n.ends_with('m') {
            return crate::analysis::units::parse_duration(&format!("{n}ms"))
                .map_err(|e| e.to_string());
        }
    }
    duration_arg(t)
}

/// `-r REQ,RESP` (or one number for both).
pub fn sizes_arg(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}' is not REQ,RESP: two byte counts such as 1,1 or 64,1024");
    let parts: Vec<&str> = s.split(',').map(|p| p.trim()).collect();
    let num = |p: &str| p.parse::<u32>().map_err(|_| bad());
    match parts.as_slice() {
        [one] => {
            let v = num(one)?;
            Ok((v, v))
        }
        [a, b] => {
            let a = if a.is_empty() { 1 } else { num(a)? };
            let b = if b.is_empty() { 1 } else { num(b)? };
            if a == 0 || b == 0 {
                return Err(bad());
            }
            Ok((a, b))
        }
        _ => Err(bad()),
    }
}

impl ProbeKind {
    /// Kind and options of the request/response and ICMP probes (None for irtt,
    /// which has options of its own).
    pub fn parts(&self) -> Option<(Kind, &ProbeOpts)> {
        match self {
            ProbeKind::TcpRr { common } => Some((Kind::TcpRr, common)),
            ProbeKind::UdpRr { common } => Some((Kind::UdpRr, common)),
            ProbeKind::Icmp { common } => Some((Kind::Icmp, common)),
            ProbeKind::Irtt(_) => None,
        }
    }
}

/// The library configuration for parsed options.
pub fn probe_config(kind: Kind, o: &ProbeOpts) -> Result<ProbeConfig> {
    let mut c = ProbeConfig::new(kind, &o.host);
    if let Some((req, resp)) = o.sizes {
        c.req_size = req;
        c.resp_size = resp;
    }
    c.port = o.port;
    c.interval = o.interval;
    if o.burst == 0 {
        bail!("-b BURST must be at least 1");
    }
    c.burst = o.burst;
    c.spin = o.spin;
    c.nodelay = o.nodelay;
    c.timeout = o.timeout;
    c.max_samples = o.max_samples;
    c.io = if o.async_io {
        IoMode::TokioReactor
    } else {
        IoMode::BlockingThread
    };
    c.stop = match (o.length, o.count) {
        (_, Some(0)) => bail!("-n COUNT must be at least 1"),
        (_, Some(n)) => Stop::Count(n),
        (Some(l), None) if !(l.is_finite() && l > 0.0) => bail!("-l SECONDS must be above zero"),
        (Some(l), None) => Stop::Duration(Duration::from_secs_f64(l)),
        (None, None) => Stop::Duration(Duration::from_secs(10)),
    };
    Ok(c)
}

/// `rttscope probe ...`
pub fn run(args: ProbeArgs) -> Result<()> {
    let (kind, o) = match &args.kind {
        ProbeKind::Irtt(a) => return crate::active::irtt::run(a.clone()),
        k => k.parts().expect("request/response or ICMP probe"),
    };
    let cfg = probe_config(kind, o)?;
    let rt = runtime()?;
    let result = rt.block_on(async {
        let (tx, rx) = cancel_pair();
        on_signals(tx);
        run_probe(&cfg, rx).await
    })?;
    let text = if o.json {
        serde_json::to_string(&result)? + "\n"
    } else if let Some(sel) = &o.output {
        output::selectors(&result, &sel.0, o.netperf_percentiles)
    } else {
        output::human(&result)
    };
    use std::io::Write;
    std::io::stdout().write_all(text.as_bytes())?;
    if result.counts.received == 0 && result.counts.sent > 0 {
        bail!(
            "no replies from {} ({} sent{})",
            result.settings.address,
            result.counts.sent,
            result
                .last_error
                .as_ref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(subcommand)]
        kind: ProbeKind,
    }

    #[test]
    fn interval_parsing() {
        assert_eq!(interval_arg("0").unwrap(), Duration::ZERO);
        assert_eq!(interval_arg("-1").unwrap(), Duration::ZERO);
        assert_eq!(interval_arg("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(interval_arg("10m").unwrap(), Duration::from_millis(10));
        assert_eq!(interval_arg("10").unwrap(), Duration::from_millis(10));
        assert_eq!(interval_arg("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(interval_arg("50u").unwrap(), Duration::from_micros(50));
        assert_eq!(interval_arg("1s").unwrap(), Duration::from_secs(1));
        assert!(interval_arg("fast").is_err());
        assert!(interval_arg("-5").is_err());
    }

    #[test]
    fn sizes_parsing() {
        assert_eq!(sizes_arg("1,1").unwrap(), (1, 1));
        assert_eq!(sizes_arg("1409, 2").unwrap(), (1409, 2));
        assert_eq!(sizes_arg("64").unwrap(), (64, 64));
        assert_eq!(sizes_arg(",2").unwrap(), (1, 2));
        assert!(sizes_arg("0,1").is_err());
        assert!(sizes_arg("a,b").is_err());
        assert!(sizes_arg("1,2,3").is_err());
    }

    #[test]
    fn probe_cli() {
        let t = T::try_parse_from([
            "probe",
            "tcp-rr",
            "10.0.0.1",
            "-w",
            "10ms",
            "-b",
            "2",
            "-l",
            "2",
            "-r",
            "1,2",
            "--nodelay",
            "-o",
            "min_latency, P99_LATENCY,THROUGHPUT",
        ])
        .unwrap();
        let (kind, o) = t.kind.parts().unwrap();
        assert_eq!(kind, Kind::TcpRr);
        let c = probe_config(kind, o).unwrap();
        assert_eq!(c.interval, Duration::from_millis(10));
        assert_eq!(c.burst, 2);
        assert_eq!((c.req_size, c.resp_size), (1, 2));
        assert_eq!(c.stop, Stop::Duration(Duration::from_secs(2)));
        assert!(c.nodelay);
        assert_eq!(o.output.as_ref().unwrap().0.len(), 3);
        let t = T::try_parse_from(["probe", "icmp", "::1", "-n", "5"]).unwrap();
        let (kind, o) = t.kind.parts().unwrap();
        let c = probe_config(kind, o).unwrap();
        assert_eq!(c.req_size, 56);
        assert_eq!(c.stop, Stop::Count(5));
        assert!(T::try_parse_from(["probe", "udp-rr", "h", "-l", "1", "-n", "3"]).is_err());
        assert!(T::try_parse_from(["probe", "udp-rr", "h", "-o", "BOGUS"]).is_err());
        let t = T::try_parse_from(["probe", "udp-rr", "h", "-b", "0"]).unwrap();
        let (kind, o) = t.kind.parts().unwrap();
        assert!(probe_config(kind, o).is_err());
    }
}
