//! `rttscope probe tcp-rr|udp-rr|icmp|irtt HOST`: each probe takes the options
//! of the tool it stands in for - netperf's for the request/response probes
//! (`-l -n -w -b -r -o`, a bare `-w` in milliseconds), ping's for ICMP (`-c -i
//! -W -w -s -q`, a line per reply), irtt's for irtt - parsed into an
//! [`crate::active::ProbeConfig`], run, and printed.
pub mod irtt;
pub mod output_opts;

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use crate::active::cancel::{cancel_pair, on_signals, runtime};
use crate::active::{output, run_probe, IoMode, Kind, ProbeConfig, Stop, DEFAULT_PORT};
use crate::analysis::units::{netperf_interval_arg, seconds_arg};
pub use output_opts::{OutputOpts, PrintFormat};

/// Help of the netperf options `probe tcp-rr|udp-rr` and `compare` share
/// (same letters, parsers and meaning).
pub const LENGTH_HELP: &str =
    "Length of the run: a bare number is seconds (netperf's -l), or a duration such as 500ms, 2min";
pub const INTERVAL_HELP: &str = "Time between the starts of bursts: a bare number is milliseconds (netperf's -w, whose 10m is 10 ms and 50u 50 us); 0 or -1: back to back; or a duration such as 250us, 1s";
pub const BURST_HELP: &str = "Transactions per interval, one after the other";
pub const SIZES_HELP: &str = "Request and response sizes in bytes (one number: both)";

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
        common: RrOpts,
        #[command(flatten)]
        tcp: TcpOpts,
    },
    /// UDP request/response (netperf UDP_RR) against `rttscope serve`; lost requests time out (-W).
    UdpRr {
        #[command(flatten)]
        common: RrOpts,
    },
    /// ICMP echo with ping's options and output: a line per reply, statistics at the end.
    Icmp {
        #[command(flatten)]
        ping: PingOpts,
    },
    /// Timed TCP handshakes to any open port (tcping, `hping3 -S`): no responder needed, no data
    /// sent; ping's options and output, a line per handshake.
    TcpConnect {
        #[command(flatten)]
        opts: ConnectOpts,
    },
    /// Isochronous UDP probe speaking irtt's protocol, against any `irtt server`: RTT, one-way delays, IPDV, up/down loss.
    Irtt(irtt::IrttArgs),
}

/// netperf's options, for the request/response probes.
#[derive(Debug, Clone, Args)]
pub struct RrOpts {
    /// Target host name or address.
    #[arg(value_name = "HOST")]
    pub host: String,
    #[arg(short = 'l', long = "length", value_name = "DURATION", default_value = "10", help = LENGTH_HELP, value_parser = seconds_arg, conflicts_with = "count")]
    pub length: Option<Duration>,
    /// Run this many transactions instead.
    #[arg(short = 'n', long = "count", value_name = "COUNT")]
    pub count: Option<u64>,
    #[arg(short = 'w', long = "interval", default_value = "0", help = INTERVAL_HELP, value_parser = netperf_interval_arg, value_name = "DURATION", allow_hyphen_values = true)]
    pub interval: Duration,
    #[arg(short = 'b', long = "burst", default_value_t = 1, help = BURST_HELP, value_name = "N")]
    pub burst: u32,
    /// Wait for the next interval by spinning on the clock instead of sleeping, as netperf's
    /// --enable-spin build; the reply is still waited for asleep (see --busy-poll).
    #[arg(long)]
    pub spin: bool,
    /// Wait for the reply by polling the socket (non-blocking receives in a loop) instead of
    /// sleeping: no wake-up in the sample, one CPU busy (not netperf's).
    #[arg(long)]
    pub busy_poll: bool,
    #[arg(short = 'r', long = "sizes", default_value = "1,1", help = SIZES_HELP, value_parser = sizes_arg, value_name = "REQ,RESP")]
    pub sizes: Option<(u32, u32)>,
    /// The responder's port (the port `rttscope serve` listens on by default).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// A reply not received within this long counts as lost (UDP); a TCP transaction taking
    /// longer fails, as does a hello unanswered this long after connecting (at least 5 s). A bare
    /// number is seconds, or a duration such as 500ms.
    #[arg(short = 'W', long = "timeout", default_value = "1", value_parser = seconds_arg, value_name = "DURATION")]
    pub timeout: Duration,
    /// netperf output selectors, comma-separated: MIN_LATENCY, MAX_LATENCY, MEAN_LATENCY,
    /// P50_LATENCY, P90_LATENCY, P99_LATENCY, STDDEV_LATENCY, THROUGHPUT, THROUGHPUT_UNITS
    /// (microseconds, transactions/s); prints a header line and a value line.
    #[arg(short = 'o', long = "output", value_name = "SELECTORS", value_parser = output::parse_selectors)]
    pub output: Option<output::Selectors>,
    /// With -o: P50/P90/P99 from the netperf-style histogram (whole us, as netperf prints) instead of exact.
    #[arg(long)]
    pub netperf_percentiles: bool,
    #[command(flatten)]
    pub out: OutputOpts,
    /// Keep at most this many per-transaction samples in the result.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub max_samples: usize,
    /// No progress line on the terminal: only the results.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Options that only TCP_RR has.
#[derive(Debug, Clone, Default, Args)]
pub struct TcpOpts {
    /// Set TCP_NODELAY on both ends.
    #[arg(long)]
    pub nodelay: bool,
    /// Drive the transactions through the tokio reactor (non-blocking
    /// sockets, epoll) instead of blocking send()/recv() on a dedicated thread.
    #[arg(long)]
    pub async_io: bool,
}

/// ping's options, for the ICMP probe.
#[derive(Debug, Clone, Args)]
pub struct PingOpts {
    /// Target host name or address.
    #[arg(value_name = "HOST")]
    pub host: String,
    /// Stop after COUNT replies or losses [default: until -w or Ctrl-C, as ping].
    #[arg(short = 'c', long = "count", value_name = "COUNT")]
    pub count: Option<u64>,
    /// Time between echo requests: a bare number is seconds (ping's -i), or a duration such as 200ms.
    #[arg(short = 'i', long = "interval", default_value = "1", value_parser = seconds_arg, value_name = "DURATION")]
    pub interval: Duration,
    /// A reply not received within this long counts as lost: a bare number is seconds (ping's -W), or a duration.
    #[arg(short = 'W', long = "timeout", default_value = "1", value_parser = seconds_arg, value_name = "DURATION")]
    pub timeout: Duration,
    /// Stop after this long whatever the count (ping's -w deadline): a bare number is seconds, or a duration.
    #[arg(short = 'w', long = "deadline", value_parser = seconds_arg, value_name = "DURATION")]
    pub deadline: Option<Duration>,
    /// Payload bytes per echo request (as ping).
    #[arg(short = 's', long = "size", default_value_t = crate::active::icmp::DEFAULT_PAYLOAD as u32, value_name = "SIZE")]
    pub size: u32,
    /// The echo requests' TTL (IPv4) or hop limit (IPv6), 1 to 255, as ping's -t; a router
    /// that it runs out at answers "Time to live exceeded" [default: the system's].
    #[arg(short = 't', long = "ttl", value_name = "TTL", value_parser = clap::value_parser!(u8).range(1..))]
    pub ttl: Option<u8>,
    /// Quiet: no line per reply, only the statistics at the end.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Numeric output only (accepted for ping's habit: rttscope never resolves names in its output).
    #[arg(short = 'n')]
    pub numeric: bool,
    /// Wait for the next request by spinning on the clock instead of sleeping.
    #[arg(long)]
    pub spin: bool,
    /// Wait for the reply by polling the socket instead of sleeping (ping does this at
    /// intervals under ~10 ms).
    #[arg(long)]
    pub busy_poll: bool,
    #[command(flatten)]
    pub out: OutputOpts,
    /// Keep at most this many per-reply samples in the result.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub max_samples: usize,
}

/// ping's options, for TCP handshakes (`probe tcp-connect`).
#[derive(Debug, Clone, Args)]
pub struct ConnectOpts {
    /// Target: HOST:PORT, [IPv6]:PORT, or HOST with -p PORT.
    #[arg(value_name = "HOST:PORT")]
    pub target: String,
    /// The port, when the target does not name one.
    #[arg(short = 'p', long = "port", value_name = "PORT")]
    pub port: Option<u16>,
    /// Stop after COUNT handshakes [default: until -w or Ctrl-C, as ping].
    #[arg(short = 'c', long = "count", value_name = "COUNT")]
    pub count: Option<u64>,
    /// Time between handshakes: a bare number is seconds (ping's -i), or a duration such as 200ms.
    #[arg(short = 'i', long = "interval", default_value = "1", value_parser = seconds_arg, value_name = "DURATION")]
    pub interval: Duration,
    /// A handshake not completed within this long counts as timed out: a bare number is seconds,
    /// or a duration. The default lets one SYN retransmission (1 s) complete.
    #[arg(short = 'W', long = "timeout", default_value = "3", value_parser = seconds_arg, value_name = "DURATION")]
    pub timeout: Duration,
    /// Stop after this long whatever the count (ping's -w deadline): a bare number is seconds, or a duration.
    #[arg(short = 'w', long = "deadline", value_parser = seconds_arg, value_name = "DURATION")]
    pub deadline: Option<Duration>,
    /// Quiet: no line per handshake, only the statistics at the end.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    #[command(flatten)]
    pub out: OutputOpts,
    /// Keep at most this many per-handshake samples in the result.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub max_samples: usize,
}

/// HOST:PORT, [IPv6]:PORT or a bare host with `-p`, into (host, port).
pub fn host_port(target: &str, port: Option<u16>) -> Result<(String, u16)> {
    let t = target.trim();
    let split = if let Some(rest) = t.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| anyhow::anyhow!("'{t}': an IPv6 address in brackets needs its ']'"))?;
        (h, after.strip_prefix(':'))
    } else if t.matches(':').count() == 1 {
        let (h, p) = t.split_once(':').unwrap_or((t, ""));
        (h, Some(p))
    } else {
        // A bare IPv6 address or a host name: no port in it.
        (t, None)
    };
    let named = match split.1 {
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| anyhow::anyhow!("'{t}': the port must be 1 to 65535"))?,
        ),
        None => None,
    };
    let port = match (named, port) {
        (Some(a), Some(b)) if a != b => bail!("'{t}' names port {a}, and -p says {b}: give one"),
        (Some(p), _) | (None, Some(p)) if p > 0 => p,
        _ => bail!("'{t}' names no port: give HOST:PORT or -p PORT"),
    };
    if split.0.is_empty() {
        bail!("'{t}' names no host");
    }
    Ok((split.0.to_string(), port))
}

/// The library configuration for `probe tcp-connect`.
pub fn connect_config(o: &ConnectOpts) -> Result<ProbeConfig> {
    let (host, port) = host_port(&o.target, o.port)?;
    let mut c = ProbeConfig::new(Kind::TcpConnect, &host);
    c.port = port;
    c.interval = o.interval;
    c.timeout = o.timeout;
    c.max_samples = o.max_samples;
    c.stop = ping_stop(o.count, o.deadline)?;
    Ok(c)
}

/// ping's stop rule: `-c`, `-w`, both (whichever first), or neither (until Ctrl-C).
fn ping_stop(count: Option<u64>, deadline: Option<Duration>) -> Result<Stop> {
    // No -c and no -w: until Ctrl-C, as ping (a run of 136 years).
    let forever = Duration::from_secs(u32::MAX as u64);
    Ok(match (count, deadline) {
        (Some(0), _) => bail!("-c COUNT must be at least 1"),
        (_, Some(d)) if d.is_zero() => bail!("-w DEADLINE must be above zero"),
        (Some(n), Some(d)) => Stop::CountOrDuration(n, d),
        (Some(n), None) => Stop::Count(n),
        (None, Some(d)) => Stop::Duration(d),
        (None, None) => Stop::Duration(forever),
    })
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

/// The refusals of -b and -l that `probe tcp-rr|udp-rr` and `compare` share.
pub fn check_netperf(length: Duration, burst: u32) -> Result<()> {
    if burst == 0 {
        bail!("-b BURST must be at least 1");
    }
    if length.is_zero() {
        bail!("-l DURATION must be above zero");
    }
    Ok(())
}

/// The library configuration for netperf-style options.
pub fn rr_config(kind: Kind, o: &RrOpts, tcp: &TcpOpts) -> Result<ProbeConfig> {
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
    c.busy_poll = o.busy_poll;
    c.nodelay = tcp.nodelay;
    c.timeout = o.timeout;
    c.max_samples = o.max_samples;
    c.io = if tcp.async_io {
        IoMode::TokioReactor
    } else {
        IoMode::BlockingThread
    };
    c.stop = match (o.length, o.count) {
        (_, Some(0)) => bail!("-n COUNT must be at least 1"),
        (_, Some(n)) => Stop::Count(n),
        (Some(l), None) if l.is_zero() => bail!("-l DURATION must be above zero"),
        (Some(l), None) => Stop::Duration(l),
        (None, None) => Stop::Duration(Duration::from_secs(10)),
    };
    Ok(c)
}

/// The library configuration for ping-style options.
pub fn ping_config(o: &PingOpts) -> Result<ProbeConfig> {
    let mut c = ProbeConfig::new(Kind::Icmp, &o.host);
    if o.size == 0 || o.size > 65_507 {
        bail!("-s SIZE must be between 1 and 65507 bytes");
    }
    c.req_size = o.size;
    c.resp_size = o.size;
    c.interval = o.interval;
    c.spin = o.spin;
    c.busy_poll = o.busy_poll;
    c.timeout = o.timeout;
    c.max_samples = o.max_samples;
    c.ttl = o.ttl;
    c.stop = ping_stop(o.count, o.deadline)?;
    Ok(c)
}

/// `rttscope probe ...`
pub fn run(args: ProbeArgs) -> Result<()> {
    match &args.kind {
        ProbeKind::Irtt(a) => irtt::run(a.clone()),
        ProbeKind::TcpRr { common, tcp } => run_rr(rr_config(Kind::TcpRr, common, tcp)?, common),
        ProbeKind::UdpRr { common } => {
            run_rr(rr_config(Kind::UdpRr, common, &TcpOpts::default())?, common)
        }
        ProbeKind::Icmp { ping } => run_ping(ping),
        ProbeKind::TcpConnect { opts } => run_connect(opts),
    }
}

/// tcping's output in ping's shape: a header line, a line per handshake as it completes, fails
/// or times out (unless -q, `--json -` or `--format csv`), the statistics at the end.
fn run_connect(o: &ConnectOpts) -> Result<()> {
    let mut cfg = connect_config(o)?;
    let lines = !o.quiet && !o.out.json_to_stdout() && o.out.format == PrintFormat::Text;
    if lines {
        let target = format!("{}:{}", cfg.target, cfg.port);
        println!("TCP-CONNECT {target}: handshakes, closed at once (no data)");
        cfg.on_line = Some(crate::active::LineHook::new(move |l| {
            println!("{}", connect_line(&target, l));
        }));
    }
    run_with_lines(cfg, lines, &o.out)
}

/// tcping's line for a handshake: `Connected to H:P: seq=1 time=0.049 ms`, `From H:P: seq=2
/// Connection refused`, `No answer from H:P: seq=3 (timed out)`.
fn connect_line(target: &str, l: &crate::active::ProbeLine) -> String {
    use crate::active::ProbeLine;
    match l {
        ProbeLine::Reply { seq, rtt_ns, .. } => {
            format!(
                "Connected to {target}: seq={seq} time={} ms",
                output::ping_ms(*rtt_ns)
            )
        }
        ProbeLine::Failed { seq, text } | ProbeLine::Error { seq, text, .. } => {
            format!("From {target}: seq={seq} {}", capitalized(text))
        }
        ProbeLine::TimedOut { seq } => format!("No answer from {target}: seq={seq} (timed out)"),
    }
}

/// "connection refused (os error 111)" as a line says it: "Connection refused".
fn capitalized(text: &str) -> String {
    let t = text.split(" (os error").next().unwrap_or(text);
    let mut c = t.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Run a probe whose lines (ping's, tcping's) print as requests end, then its summary (after a
/// blank line when there were lines).
fn run_with_lines(cfg: ProbeConfig, lines: bool, out: &OutputOpts) -> Result<()> {
    let result = run_blocking(cfg)?;
    let gap = if lines { "\n" } else { "" };
    finish(&result, &format!("{gap}{}", output::human(&result)), out)
}

fn run_rr(mut cfg: ProbeConfig, o: &RrOpts) -> Result<()> {
    let live = rr_progress("probe", &mut cfg, o.quiet);
    let result = run_blocking(cfg)?;
    drop(live);
    let text = if let Some(sel) = &o.output {
        output::selectors(&result, &sel.0, o.netperf_percentiles)
    } else {
        output::human(&result)
    };
    finish(&result, &text, &o.out)
}

/// ping's output: a header line, a line per reply and per ICMP error as they arrive (unless
/// -q, `--json -` or `--format csv`), the statistics at the end.
fn run_ping(o: &PingOpts) -> Result<()> {
    let mut cfg = ping_config(o)?;
    // Per-reply lines only where the summary goes to a terminal or a pipe of ping's text.
    let lines = !o.quiet && !o.out.json_to_stdout() && o.out.format == PrintFormat::Text;
    if lines {
        let (host, size) = (o.host.clone(), o.size);
        println!("PING {host} {size}({}) bytes of data.", size + 28);
        cfg.on_line = Some(crate::active::LineHook::new(move |l| {
            if let Some(line) = ping_line(&host, size, l) {
                println!("{line}");
            }
        }));
    }
    run_with_lines(cfg, lines, &o.out)
}

/// ping's line for a reply (`64 bytes from H: icmp_seq=1 ttl=64 time=0.049 ms`; no `ttl=`
/// when the kernel gave none) or an ICMP error (`From 10.0.0.1 icmp_seq=1 Destination Host
/// Unreachable`).
fn ping_line(host: &str, size: u32, l: &crate::active::ProbeLine) -> Option<String> {
    use crate::active::ProbeLine;
    match l {
        ProbeLine::Reply { seq, rtt_ns, ttl } => Some(format!(
            "{} bytes from {host}: icmp_seq={seq} {}time={} ms",
            size + 8,
            ttl.map(|t| format!("ttl={t} ")).unwrap_or_default(),
            output::ping_ms(*rtt_ns)
        )),
        ProbeLine::Error { seq, from, text } => Some(format!("From {from} icmp_seq={seq} {text}")),
        // ping prints nothing for an echo that timed out, nor here for a failed send.
        ProbeLine::Failed { .. } | ProbeLine::TimedOut { .. } => None,
    }
}

/// The live line of a request/response run (on a terminal, unless quiet):
/// its replies counted through the reply hook.
pub fn rr_progress(what: &str, cfg: &mut ProbeConfig, quiet: bool) -> crate::sinks::progress::Live {
    let total = match cfg.stop {
        Stop::Duration(d) | Stop::CountOrDuration(_, d) => Some(d),
        Stop::Count(_) => None,
    };
    let label = format!("{what} {} {}", cfg.kind.label(), cfg.target);
    let live = crate::sinks::progress::Live::start(quiet, label, total, Some("transaction"));
    if live.active() {
        cfg.on_reply = Some(live.hook());
    }
    live
}

fn run_blocking(cfg: ProbeConfig) -> Result<crate::active::ProbeResult> {
    let rt = runtime()?;
    rt.block_on(async {
        let (tx, rx) = cancel_pair();
        on_signals(tx);
        run_probe(&cfg, rx).await
    })
}

fn finish(result: &crate::active::ProbeResult, text: &str, out: &OutputOpts) -> Result<()> {
    out.emit(&output::probe_document(result), text)?;
    if result.counts.received == 0 && result.counts.sent > 0 {
        if result.settings.kind == crate::active::Kind::TcpConnect {
            let to = std::net::SocketAddr::new(result.settings.address, result.settings.port);
            bail!(
                "no handshake with {to} completed ({} tried: {} refused, {} timed out)",
                result.counts.sent,
                result.counts.refused,
                result.counts.lost - result.counts.errors.min(result.counts.lost)
            );
        }
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

    fn parse(args: &[&str]) -> Result<ProbeKind, clap::Error> {
        let mut v = vec!["probe"];
        v.extend_from_slice(args);
        T::try_parse_from(v).map(|t| t.kind)
    }

    #[test]
    fn interval_parsing() {
        let i = netperf_interval_arg;
        assert_eq!(i("0").unwrap(), Duration::ZERO);
        assert_eq!(i("-1").unwrap(), Duration::ZERO);
        assert_eq!(i("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(i("10m").unwrap(), Duration::from_millis(10));
        assert_eq!(i("10").unwrap(), Duration::from_millis(10));
        assert_eq!(i("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(i("50u").unwrap(), Duration::from_micros(50));
        assert_eq!(i("1s").unwrap(), Duration::from_secs(1));
        assert!(i("fast").is_err());
        assert!(i("-5").is_err());
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
    fn netperf_options() {
        let k = parse(&[
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
        let ProbeKind::TcpRr { common, tcp } = &k else {
            panic!("tcp-rr")
        };
        let c = rr_config(Kind::TcpRr, common, tcp).unwrap();
        assert_eq!(c.interval, Duration::from_millis(10));
        assert_eq!(c.burst, 2);
        assert_eq!((c.req_size, c.resp_size), (1, 2));
        assert_eq!(c.stop, Stop::Duration(Duration::from_secs(2)));
        assert!(c.nodelay);
        assert_eq!(common.output.as_ref().unwrap().0.len(), 3);
        assert!(parse(&["udp-rr", "h", "-l", "1", "-n", "3"]).is_err());
        assert!(parse(&["udp-rr", "h", "-o", "BOGUS"]).is_err());
        let k = parse(&["udp-rr", "h", "-b", "0"]).unwrap();
        let ProbeKind::UdpRr { common } = &k else {
            panic!("udp-rr")
        };
        assert!(rr_config(Kind::UdpRr, common, &TcpOpts::default()).is_err());
    }

    /// One duration grammar: -l takes netperf's bare seconds and any duration;
    /// a bare -w is milliseconds and -w -1 is accepted, as netperf.
    #[test]
    fn durations_follow_netperf() {
        for (l, want) in [("1", 1000), ("1s", 1000), ("1.5", 1500), ("500ms", 500)] {
            let k = parse(&["tcp-rr", "h", "-l", l]).unwrap();
            let ProbeKind::TcpRr { common, tcp } = &k else {
                panic!()
            };
            let c = rr_config(Kind::TcpRr, common, tcp).unwrap();
            assert_eq!(
                c.stop,
                Stop::Duration(Duration::from_millis(want)),
                "-l {l}"
            );
        }
        let k = parse(&["tcp-rr", "h", "-w", "-1"]).unwrap();
        let ProbeKind::TcpRr { common, .. } = &k else {
            panic!()
        };
        assert_eq!(common.interval, Duration::ZERO);
        let k = parse(&["udp-rr", "h", "-W", "0.5"]).unwrap();
        let ProbeKind::UdpRr { common } = &k else {
            panic!()
        };
        assert_eq!(common.timeout, Duration::from_millis(500));
        assert!(parse(&["tcp-rr", "h", "-l", "forever"]).is_err());
    }

    /// ping's options for `probe icmp`, and flags that mean nothing for a
    /// probe are refused instead of ignored.
    #[test]
    fn ping_options_and_meaningless_flags() {
        let k = parse(&[
            "icmp", "::1", "-c", "5", "-i", "0.2", "-W", "2", "-s", "100", "-q", "-n",
        ])
        .unwrap();
        let ProbeKind::Icmp { ping } = &k else {
            panic!("icmp")
        };
        let c = ping_config(ping).unwrap();
        assert_eq!(c.stop, Stop::Count(5));
        assert_eq!(c.interval, Duration::from_millis(200));
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!((c.req_size, c.resp_size), (100, 100));
        assert!(ping.quiet);
        // defaults: 1 s apart, 56 bytes, until -w or Ctrl-C
        let k = parse(&["icmp", "h"]).unwrap();
        let ProbeKind::Icmp { ping } = &k else {
            panic!()
        };
        let c = ping_config(ping).unwrap();
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.req_size, 56);
        assert!(matches!(c.stop, Stop::Duration(d) if d > Duration::from_secs(86400 * 365)));
        // -w is ping's deadline; with -c, whichever comes first
        let k = parse(&["icmp", "h", "-c", "3", "-w", "10"]).unwrap();
        let ProbeKind::Icmp { ping } = &k else {
            panic!()
        };
        assert_eq!(
            ping_config(ping).unwrap().stop,
            Stop::CountOrDuration(3, Duration::from_secs(10))
        );
        for bad in [
            &["icmp", "h", "--nodelay"][..],
            &["icmp", "h", "-p", "1234"],
            &["icmp", "h", "--async-io"],
            &["udp-rr", "h", "--nodelay"],
            &["udp-rr", "h", "--async-io"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
        let k = parse(&["icmp", "h", "-s", "0"]).unwrap();
        let ProbeKind::Icmp { ping } = &k else {
            panic!()
        };
        assert!(ping_config(ping).is_err());
    }

    /// One output convention: `--json FILE` (`-` = stdout) and `--format csv` on every probe;
    /// netperf's `-o` stays the output selectors.
    #[test]
    fn output_options() {
        for kind in ["tcp-rr", "udp-rr", "icmp", "tcp-connect"] {
            assert!(
                parse(&[kind, "h", "--json"]).is_err(),
                "{kind}: --json needs FILE"
            );
            let out = match parse(&[kind, "h", "--json", "-", "--format", "csv"]).unwrap() {
                ProbeKind::TcpRr { common, .. } | ProbeKind::UdpRr { common } => common.out,
                ProbeKind::Icmp { ping } => ping.out,
                ProbeKind::TcpConnect { opts } => opts.out,
                ProbeKind::Irtt(_) => unreachable!(),
            };
            assert!(out.json_to_stdout(), "{kind}");
            assert_eq!(out.format, PrintFormat::Csv);
            assert!(parse(&[kind, "h", "--format", "xml"]).is_err());
        }
        let k = parse(&["tcp-rr", "h", "-o", "P50_LATENCY", "--json", "r.json"]).unwrap();
        let ProbeKind::TcpRr { common, .. } = &k else {
            panic!()
        };
        assert_eq!(common.output.as_ref().unwrap().0.len(), 1);
        assert_eq!(
            common.out.json.as_deref(),
            Some(std::path::Path::new("r.json"))
        );
        let k = parse(&["irtt", "h", "-o", "-", "--json", "r.json"]).unwrap();
        let ProbeKind::Irtt(a) = &k else { panic!() };
        assert_eq!(a.output.as_deref(), Some(std::path::Path::new("-")));
        assert!(!a.out.json_to_stdout());
    }

    /// `tcp-connect`'s target: HOST:PORT, [IPv6]:PORT or HOST with -p, and one sentence for
    /// what is not one.
    #[test]
    fn tcp_connect_targets() {
        let hp = |t: &str, p: Option<u16>| host_port(t, p).map_err(|e| e.to_string());
        assert_eq!(hp("10.0.0.2:80", None).unwrap(), ("10.0.0.2".into(), 80));
        assert_eq!(hp("[fd00::2]:443", None).unwrap(), ("fd00::2".into(), 443));
        assert_eq!(hp("fd00::2", Some(22)).unwrap(), ("fd00::2".into(), 22));
        assert_eq!(
            hp("db.internal", Some(5432)).unwrap(),
            ("db.internal".into(), 5432)
        );
        assert_eq!(hp("h:80", Some(80)).unwrap(), ("h".into(), 80));
        for (bad, why) in [
            ("10.0.0.2", "names no port"),
            ("10.0.0.2:0", "1 to 65535"),
            ("10.0.0.2:http", "1 to 65535"),
            ("[fd00::2", "needs its ']'"),
            (":80", "names no host"),
        ] {
            let e = hp(bad, None).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(hp("h:80", Some(81)).unwrap_err().contains("give one"));
        let k = parse(&[
            "tcp-connect",
            "10.0.0.2:7",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "2",
        ])
        .unwrap();
        let ProbeKind::TcpConnect { opts } = &k else {
            panic!("tcp-connect")
        };
        let c = connect_config(opts).unwrap();
        assert_eq!(
            (c.kind, c.port, c.stop),
            (Kind::TcpConnect, 7, Stop::Count(3))
        );
        assert_eq!(c.interval, Duration::from_millis(200));
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert!(parse(&["tcp-connect", "h:1", "--nodelay"]).is_err());
    }

    /// tcping's lines, one per handshake.
    #[test]
    fn tcp_connect_lines() {
        use crate::active::ProbeLine;
        let t = "10.0.0.2:80";
        let reply = ProbeLine::Reply {
            seq: 1,
            rtt_ns: 10_234_000,
            ttl: None,
        };
        assert_eq!(
            connect_line(t, &reply),
            "Connected to 10.0.0.2:80: seq=1 time=10.2 ms"
        );
        let refused = ProbeLine::Failed {
            seq: 2,
            text: "connection refused (os error 111)".into(),
        };
        assert_eq!(
            connect_line(t, &refused),
            "From 10.0.0.2:80: seq=2 Connection refused"
        );
        assert_eq!(
            connect_line(t, &ProbeLine::TimedOut { seq: 3 }),
            "No answer from 10.0.0.2:80: seq=3 (timed out)"
        );
        // ping's lines stay ping's: nothing for a timed-out echo.
        assert_eq!(ping_line("h", 56, &ProbeLine::TimedOut { seq: 3 }), None);
    }
}
