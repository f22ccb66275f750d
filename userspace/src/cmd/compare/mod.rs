//! `rttscope compare`: the three views side by side, same flows, same time
//! window. Attaches the TCP view (and the sampler on `--iface`), runs the
//! TCP request/response probe (plus UDP_RR, ICMP, irtt when asked) against
//! `rttscope serve` on HOST, and prints one
//! table: one row per view. `--explain` adds short factual notes when the
//! data shows a known cause; `--json FILE` saves every sample set and setting
//! as a `results::RunResult` that `rttscope chart` can draw.
//!
//! - [`window`]: the probes and the passive views' samples over one window.
//! - [`select`]: which samples are this run's, by view and side.
//! - [`rows`]: the table's rows and the result; [`render`]: their text; [`explain`]: the notes.
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::active::rr::{Kind, ProbeConfig, Stop};
use crate::analysis::dist::BucketOptions;
use crate::analysis::results::RunResult;
use crate::analysis::units::fmt_duration_short;
use crate::analysis::view_kind::ViewKind;
use crate::session::{Session, SessionConfig};
use crate::views::{CompareViewArgs, LoaderKind};

mod explain;
mod render;
mod rows;
mod select;
mod window;

pub use explain::explain;
use render::{render_notes, render_table, rows_csv, Footer};
use rows::{read_cloud_file, Report};
pub use rows::{CloudEvidence, Row};
use select::{split_sides, Selection};
use window::{run_window, Collected};

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Host running `rttscope serve` (and `irtt server` for --irtt).
    pub host: String,
    /// The responder's port (the port `rttscope serve` listens on by default).
    #[arg(short = 'p', long, default_value_t = crate::active::serve::DEFAULT_PORT)]
    pub port: u16,
    // The netperf options, as `probe tcp-rr` takes them; all probes and views share the window.
    #[arg(short = 'l', long = "length", value_name = "DURATION", default_value = "10", help = crate::cmd::probe::LENGTH_HELP, value_parser = crate::analysis::units::seconds_arg)]
    pub length: Duration,
    #[arg(short = 'w', long = "interval", value_name = "DURATION", default_value = "0", help = crate::cmd::probe::INTERVAL_HELP, value_parser = crate::analysis::units::netperf_interval_arg, allow_hyphen_values = true)]
    pub interval: Duration,
    #[arg(short = 'b', long = "burst", value_name = "N", default_value_t = 1, help = crate::cmd::probe::BURST_HELP)]
    pub burst: u32,
    #[arg(short = 'r', long = "sizes", value_name = "REQ,RESP", default_value = "1,1", help = crate::cmd::probe::SIZES_HELP, value_parser = crate::cmd::probe::sizes_arg)]
    pub sizes: (u32, u32),
    /// TCP_NODELAY on the TCP probe.
    #[arg(long)]
    pub nodelay: bool,
    /// Run the UDP request/response probe.
    #[arg(long)]
    pub udp_rr: bool,
    /// Run an ICMP echo probe (ping) at the same interval.
    #[arg(long)]
    pub icmp: bool,
    /// Run an irtt probe against `irtt server` on HOST (port 2112) at the same interval (10ms if -w 0).
    #[arg(long)]
    pub irtt: bool,
    /// Run timed TCP handshakes (`probe tcp-connect`) to the responder's port at the same
    /// interval (10ms if -w 0): the path's RTT from the kernel's SYN to SYN-ACK, with no delayed
    /// ACK, data queue or application in it; where ICMP is dropped, still answered.
    #[arg(long)]
    pub tcp_connect: bool,
    // Each view's own options (`--iface`, `--sample-every`, `--match`), declared in its folder.
    #[command(flatten)]
    pub views: CompareViewArgs,
    /// Cloud bucket layout for the "sampler via cloud buckets" row (see `rttscope bucket --help`).
    #[arg(long, default_value = "vm_flow", value_parser = crate::analysis::dist::layout_arg)]
    pub layout: BucketOptions,
    /// Add the cloud's own numbers as one more row: a Cloud Monitoring file (projects.timeSeries.list
    /// response for vm_flow/rtt, fetched for this window; docs/cloud.md).
    #[arg(long, value_name = "FILE")]
    pub cloud: Option<PathBuf>,
    /// Add short notes explaining the differences, each with the numbers that triggered it.
    #[arg(long)]
    pub explain: bool,
    /// No progress line on the terminal: only the results.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Save every sample set and setting (a result `rttscope chart` draws); `-`: print it on
    /// stdout (the table then goes to stderr).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// What to print: the table (text), or csv: one row per view summary
    /// (`view,count,min_us,mean_us,p50_us,p90_us,p99_us,max_us,stddev_us,bucketed,what`).
    #[arg(long, value_enum, default_value = "text")]
    pub format: crate::cmd::probe::PrintFormat,
    /// BPF loader: libbpf (libbpf-rs over C libbpf) or aya (pure Rust); see docs/loaders.md.
    // Offered only in builds with aya; otherwise the one loader built in.
    #[cfg_attr(feature = "aya", arg(long, value_enum, env = "RTTSCOPE_LOADER", default_value_t = LoaderKind::DEFAULT))]
    #[cfg_attr(not(feature = "aya"), arg(skip = LoaderKind::DEFAULT))]
    pub loader: LoaderKind,
}

pub fn run(args: CompareArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(compare(args))
}

/// The driver: attach, run the window, assemble the rows, report.
async fn compare(args: CompareArgs) -> Result<()> {
    crate::cmd::probe::check_netperf(args.length, args.burst)?;
    crate::sys::preflight::require_bpf_caps()?;
    // --cloud: read before attaching, so a bad file fails first.
    let cloud_file = args.cloud.as_deref().map(read_cloud_file).transpose()?;
    let mut plan = ProbePlan::new(&args);
    let mut session = Session::attach(session_config(&args)?)?;
    // The live line counts the TCP_RR transactions (the first probe).
    let live = crate::cmd::probe::rr_progress("compare", &mut plan.rr[0], args.quiet);
    let mut raw = Collected::new();
    let (rr_results, irtt_result) =
        run_window(&plan.rr, plan.irtt.as_ref(), &mut session, &mut raw).await?;
    drop(live);
    let sel = Selection::new(
        crate::sys::netns::current_inode()?,
        &rr_results,
        raw.start_mono,
    );
    let sides = split_sides(&session, &raw, &sel)?;
    let mut report = Report {
        result: RunResult::new(
            std::env::args().collect::<Vec<_>>().join(" "),
            settings_json(&args, &plan, &session, sides.retrans)?,
        ),
        rows: Vec::new(),
    };
    report.result.start_unix_s =
        Some(raw.start_unix + (sel.origin_mono as f64 - raw.start_mono as f64) / 1e9);
    report.result.title = Some(title(&args, &session));
    let cloud = report.add_passive(&args.layout, &session, &sides);
    if let Some((name, f)) = &cloud_file {
        report.add_cloud_file(name, f);
    }
    report.add_probes(rr_results, irtt_result, plan.irtt.as_ref(), sel.origin_mono)?;
    let footer = Footer {
        others: sides.others,
        retrans: sides.retrans,
        hook: session
            .attached()
            .iter()
            .find_map(|a| a.hook.clone())
            .unwrap_or_default(),
        loader: args.loader,
    };
    output(&args, report, &footer, cloud)
}

/// The probes to run: TCP_RR always (it is the flow the TCP view and the
/// sampler observe), UDP_RR, ICMP and irtt when asked.
struct ProbePlan {
    kinds: Vec<Kind>,
    rr: Vec<ProbeConfig>,
    irtt: Option<crate::active::irtt::IrttConfig>,
}

impl ProbePlan {
    fn new(args: &CompareArgs) -> Self {
        let mut kinds = vec![Kind::TcpRr];
        if args.udp_rr {
            kinds.push(Kind::UdpRr);
        }
        if args.icmp {
            kinds.push(Kind::Icmp);
        }
        if args.tcp_connect {
            kinds.push(Kind::TcpConnect);
        }
        let rr = kinds
            .iter()
            .map(|k| {
                let mut c = ProbeConfig::new(*k, &args.host);
                c.port = args.port;
                c.interval = args.interval;
                c.burst = args.burst;
                if *k == Kind::TcpConnect {
                    // one at a time, and never back to back: each handshake holds a local port
                    // in TIME_WAIT for 60 s (10 ms: 6,000 ports)
                    c.burst = 1;
                    if c.interval.is_zero() {
                        c.interval = Duration::from_millis(10);
                    }
                }
                if !matches!(*k, Kind::Icmp | Kind::TcpConnect) {
                    c.req_size = args.sizes.0;
                    c.resp_size = args.sizes.1;
                }
                c.nodelay = args.nodelay;
                c.stop = Stop::Duration(args.length);
                c
            })
            .collect();
        let irtt = args.irtt.then(|| crate::active::irtt::IrttConfig {
            server: args.host.clone(),
            duration: args.length,
            interval: if args.interval.is_zero() {
                Duration::from_millis(10)
            } else {
                args.interval
            },
            ..Default::default()
        });
        ProbePlan { kinds, rr, irtt }
    }
}

/// What the session attaches: each view compare runs, as its folder configures it around the
/// responder's port and its own options (the registry's [`CompareViewArgs::configs`]), with
/// raw samples for the time series.
fn session_config(args: &CompareArgs) -> Result<SessionConfig> {
    Ok(SessionConfig {
        loader: args.loader,
        views: args.views.configs(args.port)?,
        keep_rows: false,
        workloads: false,
        keep_summary: false,
        raw_samples: true,
    })
}

/// The result's `settings` (the rows and notes are added at the end): compare's own, and each
/// view's settings and counters under its keys
/// ([`compare_keys`](crate::analysis::view_kind::ViewInfo::compare_keys): null when it was not
/// attached).
fn settings_json(
    args: &CompareArgs,
    plan: &ProbePlan,
    session: &Session,
    retrans: u64,
) -> Result<serde_json::Value> {
    let mut settings = json!({
        "host": args.host,
        "port": args.port,
        "length_s": args.length.as_secs_f64(),
        "interval_s": args.interval.as_secs_f64(),
        "burst": args.burst,
        "sizes": [args.sizes.0, args.sizes.1],
        "nodelay": args.nodelay,
        "probes": plan.kinds.iter().map(|k| k.label()).collect::<Vec<_>>(),
        "loader": args.loader,
        "cloud_layout": args.layout.spec(),
        "tcp_retransmits": retrans,
    });
    let keys = |kind: ViewKind| kind.info().compare_keys;
    for (view_key, counters_key) in ViewKind::ALL.iter().filter_map(|k| keys(*k)) {
        settings[view_key] = serde_json::Value::Null;
        settings[counters_key] = serde_json::Value::Null;
    }
    for (v, a) in session.views().iter().zip(session.attached()) {
        if let Some((view_key, counters_key)) = keys(a.kind) {
            settings[view_key] = a.settings.clone();
            settings[counters_key] = serde_json::to_value(v.counters()?)?;
        }
    }
    Ok(settings)
}

/// The table's first line (after "rttscope ") and the result's title.
fn title(args: &CompareArgs, session: &Session) -> String {
    // how each view samples, when it says (the sampler: ", sampler 1/4 seq")
    let briefs: String = session
        .attached()
        .iter()
        .filter_map(|a| a.brief.as_ref())
        .map(|b| format!(", {b}"))
        .collect();
    format!(
        "compare {} port {}: -l {} -w {} -b {} -r {},{}{briefs}",
        args.host,
        args.port,
        fmt_duration_short(args.length),
        fmt_duration_short(args.interval),
        args.burst,
        args.sizes.0,
        args.sizes.1,
    )
}

/// Print the table (and the notes with `--explain`), then save the result
/// with `--json`.
fn output(
    args: &CompareArgs,
    mut report: Report,
    footer: &Footer,
    cloud: Option<CloudEvidence>,
) -> Result<()> {
    // `--json -`: the result alone on stdout (for a pipe), the table on stderr.
    let json_to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    let mut out: Box<dyn Write> = if json_to_stdout {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let title = report.result.title.clone().unwrap_or_default();
    if args.format == crate::cmd::probe::PrintFormat::Csv {
        out.write_all(rows_csv(&report.rows).as_bytes())?;
    } else {
        render_table(&mut out, &title, &report.rows, footer)?;
    }
    if args.explain {
        let mut notes = explain(&report.rows, args.interval, footer.retrans, cloud);
        if footer.others > 0 {
            notes.push(format!(
                "{} passive sample(s) of other traffic (other connections or pings on this host, or the probes' own handshake and close outside their windows) are in no row: each row holds only this run's probes, from their first transaction to their last.",
                footer.others
            ));
        }
        render_notes(&mut out, &notes)?;
        report.result.settings["notes"] = json!(notes);
    }
    report.result.settings["rows"] = serde_json::to_value(&report.rows)?;
    if let Some(path) = &args.json {
        report.result.write_to(path)?;
    }
    if let (Some(path), false) = (&args.json, json_to_stdout) {
        writeln!(
            out,
            "saved: {} (draw it: rttscope chart {} -o chart.png)",
            path.display(),
            path.display()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rows::{cloud_file_row, cloud_row, summary_of};
    use super::select::Series;
    use super::*;

    fn series(us: &[f64]) -> Series {
        us.iter()
            .enumerate()
            .map(|(i, r)| (i as f64 * 0.02, *r))
            .collect()
    }

    fn series_row(view: &str, what: &str, us: &[f64]) -> Row {
        Row {
            view: view.into(),
            what: what.into(),
            summary: summary_of(&series(us)),
            bucketed: None,
        }
    }

    /// `--format csv`: a header and one row per view summary, microseconds, quoted where a field
    /// holds a comma, empty where a value is unknown.
    #[test]
    fn rows_as_csv() {
        let rows = vec![
            series_row("TCP_RR", "send()->recv(), 0 lost", &[100.0, 200.0, 300.0]),
            series_row("sampler server", "none", &[]),
        ];
        let csv = rows_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "view,count,min_us,mean_us,p50_us,p90_us,p99_us,max_us,stddev_us,bucketed,what"
        );
        assert!(
            lines[1].starts_with("TCP_RR,3,100,200,200,300,300,300,81.6"),
            "{csv}"
        );
        assert!(lines[1].ends_with(",,\"send()->recv(), 0 lost\""), "{csv}");
        assert_eq!(lines[2], "sampler server,0,,,,,,,,,none");
    }

    /// The table and the `--explain` block from fixed rows, byte for byte.
    #[test]
    fn table_and_notes_golden() {
        let client = [50.0, 60.0, 70.0, 80.0, 400.0];
        let layout = crate::analysis::dist::layout_arg("vm_flow").unwrap();
        let (cloud, evidence) = cloud_row("sampler", &layout, &series(&client));
        let rows = vec![
            series_row("tcp client", "TCP's RTT samples", &client),
            series_row(
                "tcp server",
                "responding side",
                &[19_900.0, 20_000.0, 20_100.0],
            ),
            series_row("sampler client", "packet sampler", &client),
            cloud,
            series_row("TCP_RR", "TCP_RR; 0 lost", &[90.0, 100.0, 110.0]),
            series_row("ICMP", "ICMP_ECHO; 0 lost", &[20.0, 30.0, 40.0]),
        ];
        let footer = Footer {
            others: 0,
            retrans: 2,
            hook: "cgroup sock_ops".into(),
            loader: LoaderKind::Libbpf,
        };
        let mut out = Vec::new();
        render_table(&mut out, "compare H port 7878: -l 3s", &rows, &footer).unwrap();
        let notes = explain(&rows, Duration::from_millis(20), footer.retrans, evidence);
        render_notes(&mut out, &notes).unwrap();
        render_notes(&mut out, &[]).unwrap();
        let got = String::from_utf8(out).unwrap();
        let want = [
            "rttscope compare H port 7878: -l 3s",
            "VIEW            N  MIN ms  MEAN ms  P50 ms  P90 ms  P99 ms  MAX ms  WHAT",
            "tcp client      5   0.050    0.132   0.070   0.400   0.400   0.400  TCP's RTT samples",
            "tcp server      3  19.900   20.000  20.000  20.100  20.100  20.100  responding side",
            "sampler client  5   0.050    0.132   0.070   0.400   0.400   0.400  packet sampler",
            "sampler cloud   5       -    0.132   0.500   0.900   0.990       -  sampler samples through cloud buckets (explicit:0,1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768,65536), percentile aligner interpolation",
            "TCP_RR          3   0.090    0.100   0.100   0.110   0.110   0.110  TCP_RR; 0 lost",
            "ICMP            3   0.020    0.030   0.030   0.040   0.040   0.040  ICMP_ECHO; 0 lost",
            "TCP view: 2 retransmissions on the probe's connections; hook: cgroup sock_ops (libbpf loader)",
            "",
            "note: server-side TCP RTT p50 20.000 ms is close to the probe interval 20.000 ms (below the 40 ms delayed-ACK timer) while the client side's is 0.070 ms: the client's TCP holds its ACK of each response until the next request carries it (delayed ACK), so the server times the think time.",
            "note: the cloud-bucket median 0.500 ms is interpolated inside the [0, 1) ms bucket, which holds 100% of the samples (at its midpoint when it holds them all); the exact median of the same samples is 0.070 ms: a bucketing artifact, not a network difference.",
            "note: ICMP p50 0.030 ms is below TCP_RR p50 0.100 ms: an echo is answered inside the kernel, a request/response crosses TCP and both applications.",
            "",
            "explain: no known cause of a difference is evident in this data.",
        ]
        .map(|l| format!("{l}\n"))
        .concat();
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn cloud_file_row_from_a_fixture() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cloud");
        let (name, f) = read_cloud_file(&dir.join("explicit-vm_flow.json")).unwrap();
        let row = cloud_file_row(&name, &f);
        assert_eq!((row.view.as_str(), row.summary.n), ("cloud", 1002));
        let want = 1000.0 * 50.0 / (100.0 * 1001.0 / 1002.0);
        assert!((row.summary.p50 - want).abs() < 1e-6, "{:?}", row.summary);
        assert!(row.what.contains("layout from the file"), "{}", row.what);
        let (name, f) = read_cloud_file(&dir.join("aligned-p50.json")).unwrap();
        let row = cloud_file_row(&name, &f);
        assert_eq!(row.summary.n, 2);
        assert_eq!(row.summary.mean, 500.0);
        assert!(row.summary.p50.is_nan());
        let e = read_cloud_file(&dir.join("bad-count.json")).unwrap_err();
        assert!(format!("{e:#}").contains("bucketCounts add up to 4"));
    }

    /// compare's -l, -w, -r are netperf's, parsed as probe parses them:
    /// `-l 3` and `-l 3s` are 3 s, `-w 10` and `-w 10m` are 10 ms, `-w -1` none.
    #[test]
    fn netperf_options_parse_as_probe_does() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: CompareArgs,
        }
        let p = |extra: &[&str]| {
            let mut v = vec!["compare", "h"];
            v.extend_from_slice(extra);
            T::try_parse_from(v).map(|t| t.a)
        };
        for (l, w, want_l, want_w) in [
            ("3", "10", 3000, 10),
            ("3s", "10m", 3000, 10),
            ("1.5", "-1", 1500, 0),
            ("500ms", "10ms", 500, 10),
        ] {
            let a = p(&["-l", l, "-w", w]).unwrap();
            assert_eq!(a.length, Duration::from_millis(want_l), "-l {l}");
            assert_eq!(a.interval, Duration::from_millis(want_w), "-w {w}");
        }
        assert_eq!(p(&["-r", "1409"]).unwrap().sizes, (1409, 1409));
        assert!(p(&["-r", "0,1"]).is_err());
        assert!(p(&["-l", "soon"]).is_err());
    }
}
