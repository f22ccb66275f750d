//! `rttscope bucket`: one sample set seen through several lenses — exact percentiles, the cloud
//! metric's bucketed distribution (Cloud Monitoring percentile aligners), and netperf's histogram.
//!
//! Input is an rttscope result (JSON, every view is bucketed on its own) or plain text with one RTT
//! per line: a number with an optional unit `ns`, `us` (`µs`), `ms`, `s`; a bare number is in
//! milliseconds, like the cloud metric. `#` starts a comment.
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::analysis::dist::{
    self, align, layout_arg, percentile_arg, BucketOptions, Distribution, ValueUnit,
};
use crate::analysis::results::{RunResult, Sample, ViewKind};
use crate::analysis::units::period_arg;

/// Largest input accepted (bounded memory).
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

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
    /// Alignment period of the aligned series (timed input only), as the metric API groups points.
    #[arg(long, default_value = "60s", value_parser = period_arg)]
    pub period: Duration,
    /// Only these views of a result file (repeatable; default: all).
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
}

/// A named set of RTT samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleSet {
    pub name: String,
    pub kind: Option<ViewKind>,
    /// Whether `t_s` is meaningful (result files) or not (plain lists).
    pub timed: bool,
    pub samples: Vec<Sample>,
}

/// Which way a percentile was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lens {
    /// From the samples themselves (nearest rank).
    Exact,
    /// From the Cloud Monitoring distribution (bucket interpolation).
    Cloud,
    /// From netperf's log-linear histogram.
    Netperf,
}

/// The requested percentiles through one lens; `values_us[i]` belongs to `percentiles[i]` of the
/// enclosing report (`None` when there are no samples).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LensValues {
    pub lens: Lens,
    /// How the lens computes a percentile, for the reader.
    pub method: String,
    pub values_us: Vec<Option<f64>>,
    /// True where the value is only a lower limit (percentile in the cloud overflow bucket).
    pub open_above: Vec<bool>,
}

/// One aligned period of the cloud series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlignedRow {
    pub start_s: f64,
    pub end_s: f64,
    pub count: u64,
    pub values_us: Vec<Option<f64>>,
}

/// Everything `bucket` reports about one sample set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketReport {
    pub name: String,
    pub count: usize,
    pub min_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub max_us: Option<f64>,
    pub percentiles: Vec<f64>,
    pub lenses: Vec<LensValues>,
    /// The cloud distribution of all samples.
    pub distribution: Distribution,
    /// Per alignment period (timed input only).
    pub alignment_period_s: f64,
    pub aligned: Vec<AlignedRow>,
}

/// Exact percentile by nearest rank: the smallest sample such that at least p % of the samples are
/// less than or equal to it (rank = ceil(p/100 * n), at least 1). Always an observed value.
/// `sorted` must be sorted ascending and non-empty.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    crate::analysis::stats::percentile_sorted(sorted, p)
}

/// The lenses for one sample set.
pub fn analyze(
    set: &SampleSet,
    layout: &BucketOptions,
    unit: ValueUnit,
    percentiles: &[f64],
    period_s: f64,
) -> anyhow::Result<BucketReport> {
    let mut sorted: Vec<f64> = set.samples.iter().map(|s| s.rtt_us).collect();
    sorted.sort_by(f64::total_cmp);
    let count = sorted.len();

    let exact = LensValues {
        lens: Lens::Exact,
        method: "nearest rank over the sorted samples".into(),
        values_us: percentiles
            .iter()
            .map(|&p| (count > 0).then(|| nearest_rank(&sorted, p)))
            .collect(),
        open_above: vec![false; percentiles.len()],
    };

    let mut distribution = Distribution::new(layout.clone(), unit);
    for s in &set.samples {
        distribution.add_us(s.rtt_us);
    }
    let cloud_points = percentiles
        .iter()
        .map(|&p| distribution.percentile(p))
        .collect::<Result<Vec<_>, _>>()?;
    let cloud = LensValues {
        lens: Lens::Cloud,
        method: "Cloud Monitoring ALIGN_PERCENTILE: linear interpolation inside the bucket".into(),
        values_us: cloud_points
            .iter()
            .map(|c| c.map(|c| unit.to_us(c.value)))
            .collect(),
        open_above: cloud_points
            .iter()
            .map(|c| c.is_some_and(|c| c.open_above))
            .collect(),
    };

    let mut np = crate::analysis::stats::NetperfHist::new();
    for s in &set.samples {
        np.record_us(s.rtt_us.max(0.0) as u64);
    }
    let netperf = LensValues {
        lens: Lens::Netperf,
        method: "netperf's log-linear histogram (100 buckets per decade from 1 us), HIST_get_percentile walk; whole microseconds".into(),
        values_us: percentiles.iter().map(|&p| (count > 0).then(|| np.percentile_us(p / 100.0) as f64)).collect(),
        open_above: vec![false; percentiles.len()],
    };
    let lenses = vec![exact, netperf, cloud];

    let aligned = if set.timed {
        align(
            set.samples.iter().map(|s| (s.t_s, s.rtt_us)),
            period_s,
            layout,
            unit,
        )?
        .into_iter()
        .map(|pt| {
            let values_us = percentiles
                .iter()
                .map(|&p| {
                    pt.distribution
                        .percentile(p)
                        .map(|o| o.map(|c| unit.to_us(c.value)))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AlignedRow {
                start_s: pt.start_s,
                end_s: pt.end_s,
                count: pt.distribution.count,
                values_us,
            })
        })
        .collect::<Result<Vec<_>, dist::DistError>>()?
    } else {
        Vec::new()
    };

    let mean = (count > 0).then(|| sorted.iter().sum::<f64>() / count as f64);
    Ok(BucketReport {
        name: set.name.clone(),
        count,
        min_us: sorted.first().copied(),
        mean_us: mean,
        max_us: sorted.last().copied(),
        percentiles: percentiles.to_vec(),
        lenses,
        distribution,
        alignment_period_s: period_s,
        aligned,
    })
}

/// Parse one RTT as typed in a sample list: a number, optional unit, bare = milliseconds.
/// Returns microseconds.
pub fn parse_rtt_us(s: &str) -> Option<f64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let us_per = match unit.trim() {
        "" | "ms" => 1e3,
        "ns" => 1e-3,
        "us" | "µs" => 1.0,
        "s" => 1e6,
        _ => return None,
    };
    let us = v * us_per;
    (us.is_finite() && us >= 0.0).then_some(us)
}

/// Longest piece of an input line an error message repeats.
const QUOTE_CHARS: usize = 80;

/// A piece of input for an error message: at most `QUOTE_CHARS` characters, then how much more
/// there was; control characters escaped (`\u{1b}`), so a file's escape sequences never reach the
/// terminal raw and a 200 MB line does not become a 200 MB message.
pub fn quote_input(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.char_indices();
    for (_, c) in chars.by_ref().take(QUOTE_CHARS) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if let Some((at, _)) = chars.next() {
        out.push_str(&format!("... ({} more bytes)", s.len() - at));
    }
    out
}

/// Parse a plain sample list (one value per line).
pub fn parse_sample_list(text: &str, name: &str) -> anyhow::Result<SampleSet> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let us = parse_rtt_us(line).with_context(|| {
            format!(
                "{name} line {}: '{}' is not an RTT (use a number with an optional unit ns, us, ms, s; bare numbers are ms)",
                i + 1,
                quote_input(line)
            )
        })?;
        samples.push(Sample {
            t_s: 0.0,
            rtt_us: us,
        });
    }
    anyhow::ensure!(!samples.is_empty(), "{name} contains no samples");
    Ok(SampleSet {
        name: name.to_string(),
        kind: None,
        timed: false,
        samples,
    })
}

/// Read the sample sets of a file: a result document (one set per view) or a plain list.
pub fn load_sample_sets(text: &str, name: &str) -> anyhow::Result<Vec<SampleSet>> {
    if text.trim_start().starts_with('{') {
        let r = RunResult::from_json(text, name)?;
        Ok(r.views
            .into_iter()
            .map(|v| SampleSet {
                name: v.name,
                kind: Some(v.kind),
                timed: true,
                samples: v.samples,
            })
            .collect())
    } else {
        Ok(vec![parse_sample_list(text, name)?])
    }
}

fn read_input(path: &std::path::Path) -> anyhow::Result<(String, String)> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .take(MAX_INPUT_BYTES)
            .read_to_string(&mut s)
            .context("reading samples from standard input")?;
        return Ok((s, "<stdin>".into()));
    }
    let name = path.display().to_string();
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {name}"))?;
    anyhow::ensure!(
        meta.len() <= MAX_INPUT_BYTES,
        "{name} is larger than {MAX_INPUT_BYTES} bytes"
    );
    let s = std::fs::read_to_string(path).with_context(|| format!("cannot read {name}"))?;
    Ok((s, name))
}

pub fn run(args: BucketArgs) -> anyhow::Result<()> {
    let (text, name) = read_input(&args.file)?;
    let mut sets = load_sample_sets(&text, &name)?;
    if !args.views.is_empty() {
        let known: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
        for v in &args.views {
            anyhow::ensure!(
                known.contains(v),
                "{name} has no view '{v}' (views: {})",
                known.join(", ")
            );
        }
        sets.retain(|s| args.views.contains(&s.name));
    }
    anyhow::ensure!(!sets.is_empty(), "{name} contains no views");
    let period_s = args.period.as_secs_f64();
    anyhow::ensure!(period_s > 0.0, crate::analysis::units::ZERO_PERIOD);
    let reports = sets
        .iter()
        .map(|s| analyze(s, &args.layout, args.unit, &args.percentiles, period_s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = match args.format {
        BucketFormat::Json => serde_json::to_string_pretty(&reports)? + "\n",
        BucketFormat::Table => reports
            .iter()
            .map(|r| render_table(r, args.all_buckets))
            .collect::<Vec<_>>()
            .join("\n"),
    };
    print!("{out}");
    Ok(())
}

/// A value in `unit` with the unit, at a precision that suits it.
fn fmt_in(us: f64, unit: ValueUnit) -> String {
    let v = unit.from_us(us);
    match unit {
        ValueUnit::Us => format!("{v:.1} us"),
        ValueUnit::Ms => format!("{v:.3} ms"),
        ValueUnit::S => format!("{v:.6} s"),
    }
}

fn fmt_bound(v: f64) -> String {
    if v == f64::NEG_INFINITY {
        "-inf".into()
    } else if v == f64::INFINITY {
        "+inf".into()
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn pct_label(p: f64) -> String {
    format!("p{}", fmt_bound(p))
}

/// The human table for one report.
pub fn render_table(r: &BucketReport, all_buckets: bool) -> String {
    use std::fmt::Write as _;
    let d = &r.distribution;
    let unit = d.unit;
    let mut o = String::new();
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| fmt_in(v, unit));
    let _ = writeln!(
        o,
        "{}: {} sample{}, min {}, mean {}, max {}",
        r.name,
        r.count,
        if r.count == 1 { "" } else { "s" },
        opt(r.min_us),
        opt(r.mean_us),
        opt(r.max_us)
    );
    let preset = if d.bucket_options == dist::vm_flow_preset() {
        " = vm_flow preset (an ASSUMED layout: only its 0-1 ms first bucket is known)"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "cloud distribution, layout {}{preset}, {} buckets incl. underflow/overflow, unit {}",
        d.bucket_options.spec(),
        d.bucket_options.num_buckets(),
        unit
    );
    let range_w = 26;
    let _ = writeln!(
        o,
        "  {:>6}  {:<range_w$}  {:>9}  {:>6}  {:>6}",
        "bucket",
        format!("range ({unit})"),
        "count",
        "%",
        "cum %"
    );
    let mut cum = 0u64;
    let n = d.bucket_counts.len();
    for (i, &c) in d.bucket_counts.iter().enumerate() {
        cum += c;
        if c == 0 && !all_buckets {
            continue;
        }
        let tag = if i == 0 {
            " underflow"
        } else if i == n - 1 {
            " overflow"
        } else {
            ""
        };
        let range = format!(
            "[{}, {}){tag}",
            fmt_bound(d.bucket_options.lower(i)),
            fmt_bound(d.bucket_options.upper(i))
        );
        let total = d.count.max(1) as f64;
        let _ = writeln!(
            o,
            "  {:>6}  {:<range_w$}  {:>9}  {:>6.1}  {:>6.1}",
            i,
            range,
            c,
            100.0 * c as f64 / total,
            100.0 * cum as f64 / total
        );
    }
    if d.count == 0 {
        let _ = writeln!(o, "  (no samples)");
    }
    if d.rejected > 0 {
        let _ = writeln!(o, "  {} values rejected (not finite)", d.rejected);
    }
    let _ = writeln!(o, "percentiles:");
    let lens_w = 8;
    let mut head = format!("  {:<lens_w$}", "lens");
    for &p in &r.percentiles {
        let _ = write!(head, "  {:>13}", pct_label(p));
    }
    let _ = writeln!(o, "{head}  method");
    for l in &r.lenses {
        let name = match l.lens {
            Lens::Exact => "exact",
            Lens::Cloud => "cloud",
            Lens::Netperf => "netperf",
        };
        let mut line = format!("  {name:<lens_w$}");
        for (v, open) in l.values_us.iter().zip(&l.open_above) {
            let cell = match v {
                Some(v) => format!("{}{}", if *open { ">=" } else { "" }, fmt_in(*v, unit)),
                None => "-".into(),
            };
            let _ = write!(line, "  {cell:>13}");
        }
        let _ = writeln!(o, "{line}  {}", l.method);
    }
    if r.aligned.len() > 1 {
        let _ = writeln!(
            o,
            "aligned series (period {} s, ALIGN_PERCENTILE per period, stamped at the period end):",
            fmt_bound(r.alignment_period_s)
        );
        let mut head = format!("  {:>10}  {:>7}", "end (s)", "count");
        for &p in &r.percentiles {
            let _ = write!(head, "  {:>13}", pct_label(p));
        }
        let _ = writeln!(o, "{head}");
        for row in &r.aligned {
            let mut line = format!("  {:>10}  {:>7}", fmt_bound(row.end_s), row.count);
            for v in &row.values_us {
                let _ = write!(line, "  {:>13}", opt(*v));
            }
            let _ = writeln!(o, "{line}");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::results::{ViewKind, ViewSeries};

    fn set(values_ms: &[f64]) -> SampleSet {
        SampleSet {
            name: "t".into(),
            kind: None,
            timed: false,
            samples: values_ms
                .iter()
                .map(|v| Sample {
                    t_s: 0.0,
                    rtt_us: v * 1000.0,
                })
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
        assert!(t.contains("0.500 ms"), "{t}");
        assert!(t.contains("0.200 ms"), "{t}");
        assert!(!t.contains("[1, 2)"), "empty buckets are hidden: {t}");
        assert!(render_table(&r, true).contains("[1, 2)"));
    }

    #[test]
    fn nearest_rank_definition() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(nearest_rank(&s, 0.0), 1.0);
        assert_eq!(nearest_rank(&s, 10.0), 1.0);
        assert_eq!(nearest_rank(&s, 10.1), 2.0);
        assert_eq!(nearest_rank(&s, 50.0), 5.0);
        assert_eq!(nearest_rank(&s, 95.0), 10.0);
        assert_eq!(nearest_rank(&s, 100.0), 10.0);
        assert_eq!(nearest_rank(&[7.0], 99.0), 7.0);
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
        assert!(t.contains(">=2.000 ms"), "{t}");
        assert!(t.contains("overflow"), "{t}");
    }

    #[test]
    fn result_files_give_one_set_per_view_and_aligned_rows() {
        let mut r = RunResult::new("test", serde_json::json!({}));
        let mut v = ViewSeries::new("sampler", ViewKind::Sampler);
        // 0-60 s: 0.2 ms; 60-120 s: 3 ms.
        v.samples = (0..120)
            .map(|i| Sample {
                t_s: i as f64,
                rtt_us: if i < 60 { 200.0 } else { 3000.0 },
            })
            .collect();
        r.views.push(v);
        r.views.push(ViewSeries::new("empty", ViewKind::Tcp));
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
}
