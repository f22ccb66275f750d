//! `rttscope bucket`: one sample set seen through several lenses — exact percentiles, the cloud
//! metric's bucketed distribution (Cloud Monitoring percentile aligners), and netperf's histogram.
//!
//! Input is an rttscope result (JSON, every view is bucketed on its own) or plain text with one RTT
//! per line: a number with an optional unit `ns`, `us` (`µs`), `ms`, `s`; a bare number is in
//! milliseconds, like the cloud metric. `#` starts a comment.
//!
//! - [`lenses`]: the three lenses of one sample set ([`analyze`]).
//! - [`cloud`]: a Cloud Monitoring file's points beside local samples ([`analyze_cloud`]).
//! - [`render`]: the text forms (tables, CSV).
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::analysis::cloud_monitoring;
use crate::analysis::dist::{
    self, layout_arg, percentile_arg, BucketOptions, Distribution, ValueUnit,
};
use crate::analysis::input::{self, load_sample_sets, SampleSet};
pub use crate::analysis::input::{
    is_observe_output, parse_observe_output, parse_rtt_us, parse_sample_list, quote_input,
};
use crate::analysis::results::RunResult;
use crate::analysis::units::period_arg;

mod cloud;
mod lenses;
mod render;

pub use cloud::{analyze_cloud, render_cloud_point, CloudPointReport, LocalBeside};
pub use lenses::{analyze, AlignedRow, BucketReport, Lens, LensValues};
pub use render::{buckets_csv, render_table};

/// Largest input accepted (bounded memory).
pub const MAX_INPUT_BYTES: u64 = crate::sys::files::MAX_READ_BYTES;

#[derive(Debug, Clone, Args)]
pub struct BucketArgs {
    /// Samples: an rttscope result JSON, or one RTT per line (`0.2`, `150us`, `1.5ms`; bare numbers
    /// are milliseconds). `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Bucket layout: vm_flow[:scale=1,growth=2,n=16] (assumed cloud layout: 0-1 ms then doubling),
    /// exponential:scale=S,growth=G,n=N, linear:width=W,offset=O,n=N, explicit:B1,B2,...
    #[arg(long, default_value = "vm_flow", value_parser = layout_arg)]
    pub layout: BucketOptions,
    /// Take the layout from a Cloud Monitoring file (a projects.timeSeries.list response with
    /// distribution points, see docs/cloud.md) instead of --layout: the real layout, no assumption.
    #[arg(long, value_name = "FILE", value_parser = dist::layout_from_arg, conflicts_with = "layout")]
    pub layout_from: Option<BucketOptions>,
    /// With a Cloud Monitoring FILE: local samples of the same window to put beside each cloud
    /// point (an rttscope result, `observe --format json --raw` output, or a sample list).
    #[arg(long, value_name = "RESULT_OR_OBSERVE_FILE")]
    pub local: Option<PathBuf>,
    /// Unit of the layout's bounds and of the distribution (the cloud metric uses ms).
    #[arg(long, value_enum, default_value = "ms")]
    pub unit: ValueUnit,
    /// Percentiles to report, comma-separated (0-100).
    #[arg(
        long = "percentile",
        value_name = "P,...",
        default_value = "50,95,99",
        value_delimiter = ',',
        value_parser = percentile_arg
    )]
    pub percentiles: Vec<f64>,
    /// Alignment period of the aligned series (timed input only), as the metric API groups points;
    /// a duration with a unit.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = period_arg)]
    pub period: Duration,
    /// Only these views of a result file (repeatable) [default: all].
    #[arg(long = "view", value_name = "NAME")]
    pub views: Vec<String>,
    /// Print every bucket, also the empty ones.
    #[arg(long)]
    pub all_buckets: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: BucketFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BucketFormat {
    Table,
    Json,
    /// One row per bucket of each view's cloud distribution:
    /// `view,bucket,lower_us,upper_us,count,cumulative_fraction` (empty bound = infinite).
    Csv,
    /// TimeSeries JSON for projects.timeSeries.create (docs/cloud.md).
    CloudMonitoring,
}

fn read_input(path: &std::path::Path) -> anyhow::Result<(String, String)> {
    use crate::sys::files;
    if path.as_os_str() == "-" {
        let s =
            files::read_text_capped(std::io::stdin().lock(), "standard input", MAX_INPUT_BYTES)?;
        return Ok((s, "<stdin>".into()));
    }
    Ok((files::read_to_string(path)?, path.display().to_string()))
}

pub fn run(args: BucketArgs) -> anyhow::Result<()> {
    let layout = args
        .layout_from
        .clone()
        .unwrap_or_else(|| args.layout.clone());
    // A result document in a file is read streamed, not as a whole-file string (issue 26 item 11).
    if args.local.is_none() && args.format != BucketFormat::CloudMonitoring {
        if let Some(sets) = input::stream_result_sets(&args.file) {
            return report(&args, &layout, sets, &args.file.display().to_string());
        }
    }
    let (text, name) = read_input(&args.file)?;
    if cloud_monitoring::looks_like_cloud(&text) {
        return run_cloud(&args, &text, &name);
    }
    anyhow::ensure!(
        args.local.is_none(),
        "--local is for a Cloud Monitoring FILE (a projects.timeSeries.list response); {name} is not one"
    );
    if args.format == BucketFormat::CloudMonitoring {
        let out = export_cloud(&text, &name, &layout, args.unit, &args.views)?;
        print!("{out}");
        return Ok(());
    }
    let sets = load_sample_sets(&text, &name)?;
    drop(text);
    report(&args, &layout, sets, &name)
}

/// The lenses of every view of `sets` that `--view` keeps, printed in `--format`.
fn report(
    args: &BucketArgs,
    layout: &BucketOptions,
    mut sets: Vec<SampleSet>,
    name: &str,
) -> anyhow::Result<()> {
    check_views(sets.iter().map(|s| s.name.as_str()), &args.views, name)?;
    if !args.views.is_empty() {
        sets.retain(|s| args.views.contains(&s.name));
    }
    anyhow::ensure!(!sets.is_empty(), "{name} contains no views");
    // Views that kept only a summary (observe's per-flow series, observe without --raw).
    let had = sets.len();
    sets.retain(|s| !s.samples.is_empty() || !s.timed);
    anyhow::ensure!(
        !sets.is_empty(),
        "{name} holds {had} view summaries but no samples to bucket (observe keeps samples with --raw)"
    );
    let period_s = args.period.as_secs_f64();
    anyhow::ensure!(period_s > 0.0, crate::analysis::units::ZERO_PERIOD);
    let reports = sets
        .iter()
        .map(|s| analyze(s, layout, args.unit, &args.percentiles, period_s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = match args.format {
        BucketFormat::Json | BucketFormat::CloudMonitoring => {
            serde_json::to_string_pretty(&reports)? + "\n"
        }
        BucketFormat::Table => reports
            .iter()
            .map(|r| render_table(r, args.all_buckets))
            .collect::<Vec<_>>()
            .join("\n"),
        BucketFormat::Csv => buckets_csv(&reports),
    };
    print!("{out}");
    Ok(())
}

fn run_cloud(args: &BucketArgs, text: &str, name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.format != BucketFormat::CloudMonitoring,
        "{name} is already a Cloud Monitoring file (--format cloud-monitoring writes local samples as one)"
    );
    let file = cloud_monitoring::parse(text, name)?;
    let mut local = Vec::new();
    if let Some(path) = &args.local {
        let n;
        (local, n) = match input::stream_result_sets(path) {
            Some(sets) => (sets, path.display().to_string()),
            None => {
                let (t, n) = read_input(path)?;
                (load_sample_sets(&t, &n)?, n)
            }
        };
        check_views(local.iter().map(|s| s.name.as_str()), &args.views, &n)?;
        if !args.views.is_empty() {
            local.retain(|s| args.views.contains(&s.name));
        }
    }
    let reports = analyze_cloud(&file, &local, &args.percentiles)?;
    let out = match args.format {
        BucketFormat::Table => reports
            .iter()
            .map(|r| render_cloud_point(r, args.all_buckets))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => serde_json::to_string_pretty(&reports)? + "\n",
    };
    print!("{out}");
    Ok(())
}

/// `--view`: every name asked for must be one of `known` (one sentence naming them otherwise).
fn check_views<'a>(
    known: impl Iterator<Item = &'a str>,
    views: &[String],
    name: &str,
) -> anyhow::Result<()> {
    let known: Vec<&str> = known.collect();
    for v in views {
        anyhow::ensure!(
            known.contains(&v.as_str()),
            "{name} has no view '{v}' (views: {})",
            known.join(", ")
        );
    }
    Ok(())
}

/// `--format cloud-monitoring` of a result or a sample list: create request bodies, one per line
/// (a result: one CUMULATIVE series per view over the run; a list, which has no times: one GAUGE
/// series stamped now); `views`, when not empty, the only views written.
pub fn export_cloud(
    text: &str,
    name: &str,
    layout: &BucketOptions,
    unit: ValueUnit,
    views: &[String],
) -> anyhow::Result<String> {
    let reqs = if !is_observe_output(text) && text.trim_start().starts_with('{') {
        let mut r = RunResult::from_json(text, name)?;
        check_views(r.views.iter().map(|v| v.name.as_str()), views, name)?;
        if !views.is_empty() {
            r.views.retain(|v| views.contains(&v.name));
        }
        cloud_monitoring::result_requests(&r, layout, unit)?
    } else {
        let mut sets = load_sample_sets(text, name)?;
        check_views(sets.iter().map(|s| s.name.as_str()), views, name)?;
        if !views.is_empty() {
            sets.retain(|s| views.contains(&s.name));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let host = crate::analysis::results::HostInfo::current().hostname;
        let res = cloud_monitoring::resource(&host);
        let series = sets
            .iter()
            .map(|s| {
                let mut d = Distribution::new(layout.clone(), unit);
                s.samples.iter().for_each(|x| d.add_us(x.rtt_us));
                let labels = cloud_monitoring::SeriesLabels {
                    view: s.name.clone(),
                    side: "unknown".into(),
                    netns: "unknown".into(),
                    remote_prefix: "unknown".into(),
                };
                cloud_monitoring::time_series(
                    &labels,
                    &res,
                    cloud_monitoring::MetricKind::Gauge,
                    now,
                    now,
                    &d,
                )
            })
            .collect();
        cloud_monitoring::requests(series)
    };
    Ok(reqs.iter().map(|r| r.to_string() + "\n").collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::results::Sample;
    use crate::analysis::results::{ViewKind, ViewSeries};
    use crate::analysis::view_kind::ViewKind as PassiveKind;

    fn set(values_ms: &[f64]) -> SampleSet {
        SampleSet {
            name: "t".into(),
            kind: None,
            timed: false,
            start_unix_s: None,
            samples: values_ms
                .iter()
                .map(|v| Sample::at_s(0.0, v * 1000.0))
                .collect(),
        }
    }

    #[test]
    fn command_line() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "rttscope",
            "bucket",
            "--layout",
            "exponential:scale=1,growth=2,n=10",
            "--percentile",
            "5,50,p99.9",
            "--period",
            "30s",
            "f.txt",
        ])
        .unwrap();
        let Command::Bucket(a) = cli.command else {
            panic!("not bucket")
        };
        assert_eq!(a.percentiles, vec![5.0, 50.0, 99.9]);
        assert_eq!(a.layout.num_buckets(), 12);
        assert_eq!(a.period, Duration::from_secs(30));
        let d = Cli::try_parse_from(["rttscope", "bucket", "f.txt"]).unwrap();
        let Command::Bucket(a) = d.command else {
            panic!("not bucket")
        };
        assert_eq!(a.percentiles, vec![50.0, 95.0, 99.0]);
        assert_eq!(a.layout, dist::vm_flow_preset());
        for bad in [
            vec!["rttscope", "bucket", "--percentile", "101", "f"],
            vec!["rttscope", "bucket", "--layout", "explicit:2,1", "f"],
        ] {
            assert!(Cli::try_parse_from(&bad).is_err(), "{bad:?}");
        }
    }

    /// Issue 18 item 9: a bad line was echoed whole (a 200 MB line, 200 MB on stderr) and raw
    /// (the file's escape sequences reached the terminal).
    #[test]
    fn bad_line_is_cut_and_escaped_in_the_error() {
        let mut text = String::from("1.5\n\u{1b}[2J\u{1b}]0;pwned\u{7}");
        text.push_str(&"9".repeat(1 << 20));
        text.push_str("x\n");
        let e = format!("{:#}", parse_sample_list(&text, "f.txt").unwrap_err());
        assert!(
            e.len() < 400,
            "error of {} bytes: {}...",
            e.len(),
            &e[..200]
        );
        assert!(
            !e.chars().any(|c| c.is_control()),
            "control characters in: {e:?}"
        );
        assert!(
            e.starts_with("f.txt line 2: '\\u{1b}[2J\\u{1b}]0;pwned\\u{7}999"),
            "{e:?}"
        );
        assert!(e.contains("... (1048511 more bytes)"), "{e:?}");
        // A short line is quoted whole.
        let e = format!("{:#}", parse_sample_list("abc\n", "f.txt").unwrap_err());
        assert!(e.starts_with("f.txt line 1: 'abc' is not an RTT"), "{e}");
    }

    /// `bucket --period 0s` was refused while `observe --cloud-period 0s` was accepted: both are
    /// now refused by the option parser with the same sentence.
    #[test]
    fn zero_alignment_period_is_refused_everywhere() {
        use crate::cli::Cli;
        use clap::Parser;
        for args in [
            &["rttscope", "bucket", "f.txt", "--period", "0s"][..],
            &[
                "rttscope",
                "observe",
                "--cloud-buckets",
                "--cloud-period",
                "0s",
            ][..],
            &["rttscope", "observe", "--cloud-period", "0.1ns"][..],
        ] {
            let e = Cli::try_parse_from(args)
                .map(|_| "accepted".to_string())
                .unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains("the alignment period must be longer than 0"),
                "{args:?}: {e}"
            );
        }
        assert!(Cli::try_parse_from(["rttscope", "observe", "--cloud-period", "10s"]).is_ok());
    }

    #[test]
    fn parses_values_with_units() {
        assert_eq!(parse_rtt_us("0.2"), Some(200.0));
        assert_eq!(parse_rtt_us("0.2ms"), Some(200.0));
        assert_eq!(parse_rtt_us("150us"), Some(150.0));
        assert_eq!(parse_rtt_us("150 µs"), Some(150.0));
        assert_eq!(parse_rtt_us("2500ns"), Some(2.5));
        assert_eq!(parse_rtt_us("1.5s"), Some(1.5e6));
        for bad in ["", "ms", "-1", "1x", "1.2.3", "nan", "inf", "1e3"] {
            assert_eq!(parse_rtt_us(bad), None, "{bad}");
        }
    }

    #[test]
    fn sample_list_skips_comments_and_reports_bad_lines() {
        let s = parse_sample_list("# rtts\n0.1\n\n200us  # comment\n0.3ms\n", "f").unwrap();
        assert_eq!(s.samples.len(), 3);
        assert!(!s.timed);
        assert!(parse_sample_list("# nothing\n\n", "e.txt")
            .unwrap_err()
            .to_string()
            .contains("e.txt contains no samples"));
        let e = parse_sample_list("0.1\nfast\n", "f.txt").unwrap_err();
        let msg = crate::error::sentence(&e);
        assert!(msg.contains("f.txt line 2: 'fast' is not an RTT"), "{msg}");
    }

    #[test]
    fn three_lenses_of_sub_millisecond_samples() {
        // 1000 samples between 0.1 and 0.3 ms: exact median ~0.2 ms, cloud median 0.5 ms.
        let vals: Vec<f64> = (0..1000).map(|i| 0.1 + 0.2 * i as f64 / 999.0).collect();
        let r = analyze(
            &set(&vals),
            &dist::vm_flow_preset(),
            ValueUnit::Ms,
            &[50.0, 95.0, 99.0],
            60.0,
        )
        .unwrap();
        assert_eq!(r.count, 1000);
        let exact = &r.lenses[0];
        assert_eq!(exact.lens, Lens::Exact);
        let e50 = exact.values_us[0].unwrap();
        assert!((e50 - 200.0).abs() < 0.2, "exact p50 {e50}");
        let netperf = r.lenses.iter().find(|l| l.lens == Lens::Netperf).unwrap();
        let n50 = netperf.values_us[0].unwrap();
        assert!(
            (n50 - 200.0).abs() <= 3.0,
            "netperf p50 {n50} (whole us, 1 us buckets here)"
        );
        let cloud = r.lenses.iter().find(|l| l.lens == Lens::Cloud).unwrap();
        assert!((cloud.values_us[0].unwrap() - 500.0).abs() < 1e-9);
        assert!((cloud.values_us[1].unwrap() - 950.0).abs() < 1e-9);
        assert!((cloud.values_us[2].unwrap() - 990.0).abs() < 1e-9);
        let t = render_table(&r, false);
        assert!(t.contains("[0, 1)"), "{t}");
        assert!(t.contains("p50 ms"), "units in the header: {t}");
        assert!(t.contains("  cloud     0.500"), "{t}");
        assert!(t.contains("  exact     0.200"), "{t}");
        assert!(!t.contains("[1, 2)"), "empty buckets are hidden: {t}");
        assert!(render_table(&r, true).contains("[1, 2)"));
    }

    #[test]
    fn overflow_percentiles_are_marked_as_lower_limits() {
        let layout = BucketOptions::parse("explicit:0,1,2").unwrap();
        let r = analyze(
            &set(&[0.5, 50.0, 60.0]),
            &layout,
            ValueUnit::Ms,
            &[50.0, 99.0],
            60.0,
        )
        .unwrap();
        let cloud = r.lenses.iter().find(|l| l.lens == Lens::Cloud).unwrap();
        assert_eq!(cloud.open_above, vec![true, true]);
        assert_eq!(cloud.values_us[1], Some(2000.0));
        let t = render_table(&r, false);
        assert!(t.contains(">=2.000"), "{t}");
        assert!(t.contains("overflow"), "{t}");
    }

    #[test]
    fn result_files_give_one_set_per_view_and_aligned_rows() {
        let mut r = RunResult::new("test", serde_json::json!({}));
        let mut v = ViewSeries::new("sampler", ViewKind::Passive(PassiveKind::Sampler));
        // 0-60 s: 0.2 ms; 60-120 s: 3 ms.
        v.samples = (0..120)
            .map(|i| Sample::at_s(i as f64, if i < 60 { 200.0 } else { 3000.0 }))
            .collect();
        r.views.push(v);
        r.views.push(ViewSeries::new(
            "empty",
            ViewKind::Passive(PassiveKind::Tcp),
        ));
        let text = serde_json::to_string(&r).unwrap();
        let sets = load_sample_sets(&text, "r.json").unwrap();
        assert_eq!(sets.len(), 2);
        assert!(sets[0].timed);
        let rep = analyze(
            &sets[0],
            &dist::vm_flow_preset(),
            ValueUnit::Ms,
            &[50.0],
            60.0,
        )
        .unwrap();
        assert_eq!(rep.aligned.len(), 2);
        assert_eq!((rep.aligned[0].end_s, rep.aligned[0].count), (60.0, 60));
        assert_eq!(rep.aligned[0].values_us, vec![Some(500.0)]);
        assert_eq!(rep.aligned[1].values_us, vec![Some(3000.0)]); // [2,4) ms, p50 = 3 ms
        let t = render_table(&rep, false);
        assert!(t.contains("aligned series (period 60 s"), "{t}");
        let empty = analyze(
            &sets[1],
            &dist::vm_flow_preset(),
            ValueUnit::Ms,
            &[50.0],
            60.0,
        )
        .unwrap();
        assert_eq!(empty.lenses[0].values_us, vec![None]);
        assert!(render_table(&empty, false).contains("(no samples)"));
    }

    fn cloud_fixture(name: &str) -> (String, String) {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/cloud")
            .join(name);
        (std::fs::read_to_string(&p).unwrap(), name.to_string())
    }

    /// A result whose samples fill the fixtures' first minute (2026-11-21T06:00:00Z).
    fn local_result() -> RunResult {
        let mut r = RunResult::new("test", serde_json::json!({}));
        r.start_unix_s = Some(1_795_240_800.0);
        let mut c = ViewSeries::new("tcp client", ViewKind::Passive(PassiveKind::Tcp));
        c.side = Some("client".into());
        c.flow = Some("10.99.0.1:40000 -> 10.99.0.2:5001".into());
        c.samples = (0..1000)
            .map(|i| Sample::at_s(i as f64 * 0.05, 100.0 + 200.0 * i as f64 / 999.0))
            .collect();
        // Outside the first minute: not in the window.
        c.samples.push(Sample::at_s(90.0, 9000.0));
        let mut sv = ViewSeries::new("tcp server", ViewKind::Passive(PassiveKind::Tcp));
        sv.side = Some("server".into());
        sv.samples = (0..100)
            .map(|i| Sample::at_s(i as f64 * 0.5, 20_000.0 + i as f64))
            .collect();
        r.views.push(c);
        r.views.push(sv);
        r
    }

    #[test]
    fn cloud_file_beside_local_samples_of_the_same_window() {
        let (text, name) = cloud_fixture("explicit-vm_flow.json");
        assert!(cloud_monitoring::looks_like_cloud(&text));
        let file = cloud_monitoring::parse(&text, &name).unwrap();
        let local =
            load_sample_sets(&serde_json::to_string(&local_result()).unwrap(), "r.json").unwrap();
        assert_eq!(local[0].start_unix_s, Some(1_795_240_800.0));
        let reps = analyze_cloud(&file, &local, &[50.0, 95.0, 99.0]).unwrap();
        assert_eq!(reps.len(), 1);
        let r = &reps[0];
        // The aligner's numbers from the file's own buckets: p50 = 50 / (100 * 1001/1002) ms.
        let want = 1000.0 * 50.0 / (100.0 * 1001.0 / 1002.0);
        assert!(
            (r.cloud_us[0].unwrap() - want).abs() < 1e-6,
            "{:?}",
            r.cloud_us
        );
        let c = &r.local[0];
        assert_eq!(c.count, 1000, "the sample at t=90 s is outside the minute");
        assert!((c.exact_us[0].unwrap() - 200.0).abs() < 0.2);
        assert!((c.rebucketed_us[0].unwrap() - 500.0).abs() < 1e-9);
        assert_eq!(c.rebucketed.bucket_options, dist::vm_flow_preset());
        assert!(
            c.notes.iter().any(|n| n.starts_with("bucket width:")),
            "{:?}",
            c.notes
        );
        let s = &r.local[1];
        assert!(
            s.notes.iter().any(|n| n.starts_with("delayed ACKs:")),
            "{:?}",
            s.notes
        );
        let t = render_cloud_point(r, false);
        assert!(t.contains("(taken from the file)"), "{t}");
        assert!(t.contains("tcp client exact"), "{t}");
        assert!(t.contains("0.500"), "{t}");
    }

    #[test]
    fn aligned_doubles_and_cumulative_points() {
        let (text, name) = cloud_fixture("aligned-p50.json");
        let file = cloud_monitoring::parse(&text, &name).unwrap();
        let reps = analyze_cloud(&file, &[], &[50.0]).unwrap();
        assert_eq!(reps.len(), 2);
        assert_eq!(reps[0].value_kind, "aligned double");
        assert_eq!(reps[0].value, Some(0.5));
        assert_eq!(reps[0].cloud_us, vec![None]);
        assert!(render_cloud_point(&reps[0], false)
            .contains("already reduced by the request's aligner"));
    }

    /// Out and back in: a result written as TimeSeries and read as if it came from the cloud
    /// gives the same distribution and percentiles as `bucket` of the result itself.
    #[test]
    fn exported_result_reads_back_with_the_same_distribution() {
        let r = local_result();
        let text = serde_json::to_string(&r).unwrap();
        let layout = dist::vm_flow_preset();
        let out = export_cloud(&text, "r.json", &layout, ValueUnit::Ms, &[]).unwrap();
        assert!(out.ends_with('\n'));
        let file = cloud_monitoring::parse(&out, "out.jsonl").unwrap();
        assert_eq!(file.series.len(), 2);
        let ps = [50.0, 95.0, 99.0];
        let reps = analyze_cloud(&file, &[], &ps).unwrap();
        let sets = load_sample_sets(&text, "r.json").unwrap();
        for (rep, set) in reps.iter().zip(&sets) {
            let local = analyze(set, &layout, ValueUnit::Ms, &ps, 60.0).unwrap();
            let d = rep.distribution.as_ref().unwrap();
            assert_eq!(d.bucket_counts, local.distribution.bucket_counts);
            assert_eq!(d.count, local.distribution.count);
            let cloud_lens = local.lenses.iter().find(|l| l.lens == Lens::Cloud).unwrap();
            assert_eq!(rep.cloud_us, cloud_lens.values_us, "{}", set.name);
            assert_eq!(rep.metric_kind, "CUMULATIVE");
            assert_eq!(rep.start_unix_s, Some(1_795_240_800.0));
        }
        assert_eq!(
            dist::layout_from_json(&out, "out.jsonl").unwrap(),
            layout,
            "--layout-from reads the written layout back"
        );
        // A plain list (no times) becomes a GAUGE point.
        let out = export_cloud("0.2\n0.3\n", "l.txt", &layout, ValueUnit::Ms, &[]).unwrap();
        let f = cloud_monitoring::parse(&out, "l").unwrap();
        assert_eq!(f.series[0].metric_kind, "GAUGE");
    }

    #[test]
    fn observe_raw_output_is_a_local_sample_source() {
        let text = concat!(
            r#"{"type":"start","version":1,"ts":1795240800.5,"views":["tcp"],"settings":{}}"#,
            "\n",
            r#"{"type":"sample","view":"tcp","t":0.5,"netns":1,"local":"a","remote":"b","side":"client","rtt_us":150,"srtt_us":140}"#,
            "\n",
            r#"{"type":"interval","t":1.0,"flows":[]}"#,
            "\n",
            r#"{"type":"sample","view":"sampler","t":0.7,"netns":1,"local":"a","remote":"b","rtt_us":170,"match":"seq"}"#,
            "\n",
        );
        let sets = load_sample_sets(text, "o.jsonl").unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].name, "tcp client");
        assert_eq!(sets[1].name, "sampler");
        assert_eq!(sets[0].start_unix_s, Some(1_795_240_800.5));
        assert_eq!(sets[0].samples[0].rtt_us, 150.0);
        let e = load_sample_sets(
            concat!(r#"{"type":"start","ts":1,"views":["tcp"]}"#, "\n"),
            "o",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("without raw samples"), "{e}");
    }

    #[test]
    fn layout_from_and_local_options() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cloud");
        let lin = dir.join("linear.json");
        let cli = Cli::try_parse_from([
            "rttscope",
            "bucket",
            "--layout-from",
            lin.to_str().unwrap(),
            "--local",
            "r.json",
            "f.txt",
        ])
        .unwrap();
        let Command::Bucket(a) = cli.command else {
            panic!()
        };
        assert_eq!(
            a.layout_from,
            Some(BucketOptions::parse("linear:width=0.5,offset=0,n=8").unwrap())
        );
        let spec = format!("from:{}", lin.display());
        let cli = Cli::try_parse_from(["rttscope", "bucket", "--layout", &spec, "f.txt"]).unwrap();
        let Command::Bucket(a) = cli.command else {
            panic!()
        };
        assert_eq!(a.layout.num_buckets(), 10);
        assert!(Cli::try_parse_from([
            "rttscope",
            "bucket",
            "--layout",
            "vm_flow",
            "--layout-from",
            lin.to_str().unwrap(),
            "f"
        ])
        .is_err());
        let dbl = dir.join("aligned-p50.json");
        let e = Cli::try_parse_from([
            "rttscope",
            "bucket",
            "--layout-from",
            dbl.to_str().unwrap(),
            "f",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("holds no distribution point"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 256,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Any text as a sample list: no panic; an error names a line and quotes at most
        /// `QUOTE_CHARS` characters of it, with no control character left raw.
        #[test]
        fn any_sample_list_parses_or_fails_in_one_short_sentence(
            text in "(([0-9.]{0,12}(ns|us|ms|s|µs|x)?|[\\x00-\\x7f]{0,200}|\\PC{0,40})\n){0,8}"
        ) {
            if let Err(e) = parse_sample_list(&text, "f.txt") {
                let e = format!("{e:#}");
                proptest::prop_assert!(e.starts_with("f.txt "), "{:?}", e);
                proptest::prop_assert!(!e.chars().any(|c| c.is_control()), "{:?}", e);
                proptest::prop_assert!(e.chars().count() < 600, "{:?}", e);
            }
        }
    }

    /// `--format csv`: every bucket of every view, bounds in microseconds, counts adding up to
    /// the samples; a document whose views hold only summaries is refused in one sentence.
    #[test]
    fn buckets_as_csv() {
        let set = SampleSet {
            name: "tcp, client".into(),
            kind: None,
            timed: false,
            start_unix_s: None,
            samples: [300.0, 1500.0, 1600.0, 5000.0]
                .iter()
                .map(|&us| Sample::at_s(0.0, us))
                .collect(),
        };
        let layout = dist::layout_arg("explicit:1,2").unwrap();
        let r = analyze(&set, &layout, ValueUnit::Ms, &[50.0], 60.0).unwrap();
        let csv = buckets_csv(&[r]);
        assert_eq!(
            csv,
            "view,bucket,lower_us,upper_us,count,cumulative_fraction\n\
             \"tcp, client\",0,,1000,1,0.25\n\
             \"tcp, client\",1,1000,2000,2,0.75\n\
             \"tcp, client\",2,2000,,1,1\n"
        );
    }
}
