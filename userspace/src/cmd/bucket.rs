//! `rttscope bucket`: one sample set seen through several lenses — exact percentiles, the cloud
//! metric's bucketed distribution (Cloud Monitoring percentile aligners), and netperf's histogram.
//!
//! Input is an rttscope result (JSON, every view is bucketed on its own) or plain text with one RTT
//! per line: a number with an optional unit `ns`, `us` (`µs`), `ms`, `s`; a bare number is in
//! milliseconds, like the cloud metric. `#` starts a comment.
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::analysis::cloud_monitoring::{self, CloudPoint, CloudSeries, PointValue};
use crate::analysis::dist::{
    self, align, layout_arg, percentile_arg, BucketOptions, Distribution, ValueUnit,
};
use crate::analysis::input::{self, SampleSet};
pub use crate::analysis::input::{
    is_observe_output, parse_observe_output, parse_rtt_us, parse_sample_list, quote_input,
};
use crate::analysis::results::RunResult;
// The one percentile of exact samples (docs/results.md): the nearest rank, an observed value.
use crate::analysis::stats::percentile_sorted as nearest_rank;
use crate::analysis::units::period_arg;
use crate::sinks::table::{count, Align, Table};

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
    let cloud = cloud_lens(&distribution, percentiles, unit)?;
    let netperf = netperf_lens(set, percentiles);
    let lenses = vec![exact, netperf, cloud];

    let aligned = if set.timed {
        aligned_rows(set, period_s, layout, unit, percentiles)?
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

/// The cloud's lens: Cloud Monitoring's interpolation in the distribution's buckets.
fn cloud_lens(
    distribution: &Distribution,
    percentiles: &[f64],
    unit: ValueUnit,
) -> anyhow::Result<LensValues> {
    let cloud_points = percentiles
        .iter()
        .map(|&p| distribution.percentile(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LensValues {
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
    })
}

/// netperf's lens: its log-linear histogram, whole microseconds.
fn netperf_lens(set: &SampleSet, percentiles: &[f64]) -> LensValues {
    let count = set.samples.len();
    let mut np = crate::analysis::stats::NetperfHist::new();
    for s in &set.samples {
        np.record_us(s.rtt_us.max(0.0) as u64);
    }
    LensValues {
        lens: Lens::Netperf,
        method: "netperf's log-linear histogram (100 buckets per decade from 1 us), HIST_get_percentile walk; whole microseconds".into(),
        values_us: percentiles.iter().map(|&p| (count > 0).then(|| np.percentile_us(p / 100.0) as f64)).collect(),
        open_above: vec![false; percentiles.len()],
    }
}

/// The cloud's percentiles per alignment period of timed samples.
fn aligned_rows(
    set: &SampleSet,
    period_s: f64,
    layout: &BucketOptions,
    unit: ValueUnit,
    percentiles: &[f64],
) -> anyhow::Result<Vec<AlignedRow>> {
    Ok(align(
        set.samples.iter().map(|s| (s.t_s(), s.rtt_us)),
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
    .collect::<Result<Vec<_>, dist::DistError>>()?)
}

/// rttscope 0.1's `probe --json` as a result document (the reader in analysis/ takes it as a
/// hook: the probe's types live in active/).
pub fn legacy_probe(text: &str) -> Option<RunResult> {
    crate::active::output::parse_probe_json(text).map(|p| crate::active::output::probe_document(&p))
}

/// Any measuring command's output as a result document (see [`input::result_from_text`]).
pub fn result_from_text(text: &str, name: &str) -> anyhow::Result<RunResult> {
    input::result_from_text(text, name, Some(legacy_probe))
}

/// The sample sets of a file (see [`input::load_sample_sets`]).
pub fn load_sample_sets(text: &str, name: &str) -> anyhow::Result<Vec<SampleSet>> {
    input::load_sample_sets(text, name, Some(legacy_probe))
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

// --- Cloud Monitoring files (docs/cloud.md) ----------------------------------------------------

/// Local samples beside one cloud point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalBeside {
    /// The local view (set) name.
    pub name: String,
    /// Which local samples were used: those in the point's interval, or all of them.
    pub window: String,
    pub count: usize,
    /// Exact percentiles (nearest rank) of the local samples, us.
    pub exact_us: Vec<Option<f64>>,
    /// The local samples re-bucketed with the cloud point's own layout, then the aligner's
    /// interpolation, us.
    pub rebucketed_us: Vec<Option<f64>>,
    pub rebucketed_open_above: Vec<bool>,
    /// The local distribution in the cloud's layout.
    pub rebucketed: Distribution,
    /// Why the numbers differ, each with its numbers (only what the data shows).
    pub notes: Vec<String>,
}

/// One cloud point as `bucket` reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudPointReport {
    /// 1-based number of the time series in the file.
    pub series: usize,
    pub metric: String,
    pub resource: String,
    pub metric_kind: String,
    pub value_type: String,
    pub unit: ValueUnit,
    /// False: the file gives no unit and milliseconds (vm_flow/rtt's unit) are assumed.
    pub unit_given: bool,
    pub interval: String,
    pub start_unix_s: Option<f64>,
    pub end_unix_s: f64,
    /// `distribution`, `aligned double`, `int64` or `empty distribution`.
    pub value_kind: String,
    pub distribution: Option<Distribution>,
    /// The value of an already-aligned point (in the series' unit).
    pub value: Option<f64>,
    pub percentiles: Vec<f64>,
    /// The aligner's percentiles computed from the file's bucket counts, us.
    pub cloud_us: Vec<Option<f64>>,
    pub cloud_open_above: Vec<bool>,
    /// Earlier points of a CUMULATIVE series not shown (the last point holds them).
    pub earlier_cumulative_points: usize,
    pub local: Vec<LocalBeside>,
}

/// The resolution of the times in a Cloud Monitoring file rttscope writes (RFC 3339 with
/// microseconds): a local sample this close to a point's start or end belongs to it.
const TIME_RESOLUTION_S: f64 = 1e-6;

/// The local samples of `set` that fall into a point's interval (all of them when the point is a
/// GAUGE instant or the local samples have no wall-clock time), and how they were chosen.
fn local_window(set: &SampleSet, p: &CloudPoint) -> (Vec<f64>, String) {
    let all = || set.samples.iter().map(|s| s.rtt_us).collect::<Vec<f64>>();
    let Some(anchor) = set.start_unix_s.filter(|_| set.timed) else {
        return (
            all(),
            "all local samples (they carry no wall-clock time)".into(),
        );
    };
    let start = match p.start_unix_s {
        Some(s) if s < p.end_unix_s => s,
        _ => {
            return (
                all(),
                "all local samples (the cloud point is an instant, no window)".into(),
            )
        }
    };
    let v: Vec<f64> = set
        .samples
        .iter()
        .filter(|s| {
            (start - TIME_RESOLUTION_S..=p.end_unix_s + TIME_RESOLUTION_S)
                .contains(&(anchor + s.t_s()))
        })
        .map(|s| s.rtt_us)
        .collect();
    (v, format!("local samples in {}", p.interval_text()))
}

fn pct_of(d: &Distribution, ps: &[f64]) -> anyhow::Result<(Vec<Option<f64>>, Vec<bool>)> {
    let pts = ps
        .iter()
        .map(|&p| d.percentile(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        pts.iter()
            .map(|c| c.map(|c| d.unit.to_us(c.value)))
            .collect(),
        pts.iter()
            .map(|c| c.is_some_and(|c| c.open_above))
            .collect(),
    ))
}

/// Explain the gap between the cloud's and the local numbers at the median (or the first
/// percentile asked), from what the data shows.
fn gap_notes(
    cloud: &Distribution,
    cloud_us: Option<f64>,
    local: &LocalBeside,
    p: f64,
    k: usize,
) -> Vec<String> {
    let mut notes = Vec::new();
    let ms = |us: f64| format!("{:.3} ms", us / 1000.0);
    let (Some(exact), Some(rebucketed)) = (local.exact_us[k], local.rebucketed_us[k]) else {
        return notes;
    };
    let pl = pct_label(p);
    if (rebucketed - exact).abs() > 0.1 * exact.max(1.0) {
        let b = cloud.unit.from_us(exact);
        let i = cloud.bucket_options.index(b);
        let share =
            100.0 * local.rebucketed.bucket_counts[i] as f64 / local.rebucketed.count.max(1) as f64;
        notes.push(format!(
            "bucket width: the local samples' exact {pl} is {}; through the cloud's own buckets the same samples give {} ({share:.0}% of them in [{}, {}) {}): {} of the difference is the bucketing, not the network.",
            ms(exact),
            ms(rebucketed),
            fmt_bound(cloud.bucket_options.lower(i)),
            fmt_bound(cloud.bucket_options.upper(i)),
            cloud.unit,
            ms((rebucketed - exact).abs())
        ));
    }
    if let Some(c) = cloud_us {
        if (c - rebucketed).abs() > 0.1 * rebucketed.max(1.0) {
            notes.push(format!(
                "different samples: with the same buckets the cloud's {pl} is {} and the local samples' {}: the cloud sampled other packets (its sampler takes a fraction of them, and for vm_flow/rtt only some flows), another time or the other end of the flow.",
                ms(c),
                ms(rebucketed)
            ));
        }
    }
    if cloud.count > 0 && (cloud.count < 30 || (cloud.count as f64) < 0.5 * local.count as f64) {
        notes.push(format!(
            "sampling: the cloud counted {} RTT samples in this interval, the local view {}: {}",
            cloud.count,
            local.count,
            if cloud.count < 30 {
                "with so few samples each one moves a percentile by a large part of a bucket."
            } else {
                "the cloud's packet sampler sees only a fraction of the packets."
            }
        ));
    }
    if let Some(c) = cloud_us {
        notes.extend(delayed_ack_notes(&local.name, exact, c, &pl));
    }
    notes
}

/// When one side's percentile is far above the other's: the responding
/// side of a request/response flow times the other side's think time.
fn delayed_ack_notes(name: &str, exact: f64, c: f64, pl: &str) -> Vec<String> {
    let ms = |us: f64| format!("{:.3} ms", us / 1000.0);
    let mut notes = Vec::new();
    let responding = name.contains("server");
    if responding && exact >= 3.0 * c && exact >= 2000.0 {
        notes.push(format!(
            "delayed ACKs: this local view is the responding side ({pl} {}, {:.0}x the cloud's {}): in a request/response flow the client's ACK of each response waits for its next request (or the 40 ms delayed-ACK timer), so the responding side times the client's think time; compare the cloud with a client-side view.",
            ms(exact),
            exact / c.max(1e-9),
            ms(c)
        ));
    }
    if c >= 3.0 * exact && c >= 2000.0 && !responding {
        notes.push(format!(
            "delayed ACKs: the cloud's {pl} {} is {:.0}x the local {}; if the cloud's samples come from the responding side of a request/response flow, its ACKs wait for the next request (or the 40 ms delayed-ACK timer) and the RTT includes the other side's think time: compare with a local server-side view (e.g. `tcp server`).",
            ms(c),
            c / exact.max(1e-9),
            ms(exact)
        ));
    }
    notes
}

/// Every point of a Cloud Monitoring file, with local samples beside it.
pub fn analyze_cloud(
    file: &cloud_monitoring::CloudFile,
    local: &[SampleSet],
    percentiles: &[f64],
) -> anyhow::Result<Vec<CloudPointReport>> {
    let k = percentiles.iter().position(|&p| p == 50.0).unwrap_or(0);
    let mut out = Vec::new();
    for (si, s) in file.series.iter().enumerate() {
        let shown: Vec<&CloudPoint> = if s.metric_kind == "CUMULATIVE" {
            s.points.last().into_iter().collect()
        } else {
            s.points.iter().collect()
        };
        let hidden = s.points.len() - shown.len();
        for p in shown {
            out.push(point_report(si, s, p, hidden, local, percentiles, k)?);
        }
    }
    anyhow::ensure!(!out.is_empty(), "{} holds no points", file.name);
    Ok(out)
}

fn point_report(
    si: usize,
    s: &CloudSeries,
    p: &CloudPoint,
    hidden: usize,
    local: &[SampleSet],
    percentiles: &[f64],
    k: usize,
) -> anyhow::Result<CloudPointReport> {
    let none = vec![None; percentiles.len()];
    let (value_kind, distribution, value) = match &p.value {
        PointValue::Distribution(d) => ("distribution", Some((**d).clone()), None),
        PointValue::EmptyDistribution => ("empty distribution", None, None),
        PointValue::Double(v) => ("aligned double", None, Some(*v)),
        PointValue::Int64(v) => ("int64", None, Some(*v as f64)),
    };
    let (cloud_us, cloud_open_above) = match &distribution {
        Some(d) => pct_of(d, percentiles)?,
        None => (none.clone(), vec![false; percentiles.len()]),
    };
    let mut beside = Vec::new();
    for set in local {
        let l = local_beside(
            set,
            (s, p),
            distribution.as_ref(),
            percentiles,
            k,
            cloud_us[k],
        )?;
        beside.push(l);
    }
    Ok(CloudPointReport {
        series: si + 1,
        metric: s.metric_text(),
        resource: s.resource_text(),
        metric_kind: s.metric_kind.clone(),
        value_type: s.value_type.clone(),
        unit: s.unit,
        unit_given: s.unit_given,
        interval: p.interval_text(),
        start_unix_s: p.start_unix_s,
        end_unix_s: p.end_unix_s,
        value_kind: value_kind.into(),
        distribution,
        value,
        percentiles: percentiles.to_vec(),
        cloud_us,
        cloud_open_above,
        earlier_cumulative_points: hidden,
        local: beside,
    })
}

/// One local sample set beside cloud point `p` of series `s`: its samples in
/// the point's window, exactly and through the cloud's buckets, and the notes
/// on how they differ from the cloud's (`k`: the percentile the notes are on,
/// `cloud_k` the cloud's value of it).
fn local_beside(
    set: &SampleSet,
    (s, p): (&CloudSeries, &CloudPoint),
    distribution: Option<&Distribution>,
    percentiles: &[f64],
    k: usize,
    cloud_k: Option<f64>,
) -> anyhow::Result<LocalBeside> {
    let none = vec![None; percentiles.len()];
    let (mut v, window) = local_window(set, p);
    v.sort_by(f64::total_cmp);
    let exact_us: Vec<Option<f64>> = percentiles
        .iter()
        .map(|&q| (!v.is_empty()).then(|| nearest_rank(&v, q)))
        .collect();
    let layout = distribution
        .map(|d| (d.bucket_options.clone(), d.unit))
        .unwrap_or((dist::vm_flow_preset(), s.unit));
    let mut rb = Distribution::new(layout.0, layout.1);
    for &us in &v {
        rb.add_us(us);
    }
    let (rebucketed_us, rebucketed_open_above) = if distribution.is_some() {
        pct_of(&rb, percentiles)?
    } else {
        (none, vec![false; percentiles.len()])
    };
    let mut l = LocalBeside {
        name: set.name.clone(),
        window,
        count: v.len(),
        exact_us,
        rebucketed_us,
        rebucketed_open_above,
        rebucketed: rb,
        notes: Vec::new(),
    };
    if let Some(d) = distribution {
        l.notes = gap_notes(d, cloud_k, &l, percentiles[k], k);
    }
    Ok(l)
}

/// The human text for one cloud point.
pub fn render_cloud_point(r: &CloudPointReport, all_buckets: bool) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    write_cloud_series_line(&mut o, r);
    write_cloud_value(&mut o, r, all_buckets);
    let (t, notes) = lens_table(r);
    indent(&mut o, &t);
    for n in &notes {
        let _ = writeln!(o, "    - {n}");
    }
    if r.local.is_empty() {
        let _ = writeln!(
            o,
            "  (give --local RESULT_OR_OBSERVE_FILE to put local samples of the same window beside it)"
        );
    }
    o
}

/// The point's series: metric, resource, kinds and unit.
fn write_cloud_series_line(o: &mut String, r: &CloudPointReport) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "cloud series {}: {} | resource {} | {} {} | unit {}{}",
        r.series,
        r.metric,
        r.resource,
        if r.metric_kind.is_empty() {
            "?"
        } else {
            &r.metric_kind
        },
        if r.value_type.is_empty() {
            "?"
        } else {
            &r.value_type
        },
        r.unit,
        if r.unit_given {
            ""
        } else {
            " (not in the file: assumed, the vm_flow/rtt metric's unit)"
        }
    );
}

/// The point's value: its distribution (with the layout and buckets), an
/// already reduced value, or that it is empty.
fn write_cloud_value(o: &mut String, r: &CloudPointReport, all_buckets: bool) {
    use std::fmt::Write as _;
    let unit = r.unit;
    let hidden = if r.earlier_cumulative_points > 0 {
        format!(
            " (CUMULATIVE: this last point holds the {} earlier ones)",
            r.earlier_cumulative_points
        )
    } else {
        String::new()
    };
    match (&r.distribution, r.value) {
        (Some(d), _) => {
            let sd = if d.count > 1 {
                (d.sum_of_squared_deviation / (d.count - 1) as f64).sqrt()
            } else {
                0.0
            };
            let _ = writeln!(
                o,
                "point {}{hidden}: distribution of {} sample{}, mean {:.3} {unit}, sd {:.3} {unit} (from the file)",
                r.interval,
                d.count,
                if d.count == 1 { "" } else { "s" },
                d.mean,
                sd
            );
            let _ = writeln!(
                o,
                "layout {} (taken from the file), {} buckets incl. underflow/overflow",
                d.bucket_options.spec(),
                d.bucket_options.num_buckets()
            );
            write_buckets(o, d, all_buckets);
        }
        (None, Some(v)) => {
            let _ = writeln!(
                o,
                "point {}{hidden}: {} {} {unit} — already reduced by the request's aligner/reducer (e.g. ALIGN_PERCENTILE_50); no buckets, and the file does not say which statistic it is",
                r.interval, r.value_kind, v
            );
        }
        (None, None) => {
            let _ = writeln!(
                o,
                "point {}{hidden}: empty distribution (no samples)",
                r.interval
            );
        }
    }
}

/// One row of the lens table: a name, a cell per percentile, the method.
fn lens_row(
    name: String,
    vals: &[Option<f64>],
    open: &[bool],
    method: String,
    unit: ValueUnit,
) -> Vec<String> {
    let mut c = vec![name];
    for (i, v) in vals.iter().enumerate() {
        c.push(pct_cell(*v, open.get(i).copied().unwrap_or(false), unit));
    }
    c.push(method);
    c
}

/// The percentiles through each lens (the cloud's, each local set's exact
/// and re-bucketed ones), and the notes on their gaps.
fn lens_table(r: &CloudPointReport) -> (Table, Vec<String>) {
    let unit = r.unit;
    let mut t = pct_table("LENS", &r.percentiles, unit, &["METHOD"]);
    if r.distribution.is_some() {
        t.row(lens_row(
            "cloud".into(),
            &r.cloud_us,
            &r.cloud_open_above,
            "ALIGN_PERCENTILE interpolation in the file's buckets".into(),
            unit,
        ));
    }
    let mut notes = Vec::new();
    for l in &r.local {
        t.row(lens_row(
            format!("{} exact", l.name),
            &l.exact_us,
            &[],
            format!(
                "nearest rank over {}: {}",
                count(l.count as u64, "sample"),
                l.window
            ),
            unit,
        ));
        if r.distribution.is_some() {
            t.row(lens_row(
                format!("{} cloud-b.", l.name),
                &l.rebucketed_us,
                &l.rebucketed_open_above,
                "the same samples through the cloud's layout, same interpolation".into(),
                unit,
            ));
        }
        notes.extend(l.notes.iter().map(|n| format!("{}: {n}", l.name)));
    }
    (t, notes)
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

/// A value in `unit` with the unit, at a precision that suits it.
fn fmt_in(us: f64, unit: ValueUnit) -> String {
    format!("{} {unit}", fmt_num(us, unit))
}

/// A value in `unit`, bare (a table cell: the unit is in the header).
fn fmt_num(us: f64, unit: ValueUnit) -> String {
    let v = unit.from_us(us);
    match unit {
        ValueUnit::Us => format!("{v:.1}"),
        ValueUnit::Ms => format!("{v:.3}"),
        ValueUnit::S => format!("{v:.6}"),
    }
}

/// A percentile cell: `-` when none, `>=` when only a lower bound is known.
fn pct_cell(v: Option<f64>, open: bool, unit: ValueUnit) -> String {
    match v {
        Some(v) => format!("{}{}", if open { ">=" } else { "" }, fmt_num(v, unit)),
        None => "-".into(),
    }
}

/// A table whose first column is `first` and then one column per percentile
/// (`p50 ms`), then `rest`.
fn pct_table(first: &str, pcts: &[f64], unit: ValueUnit, rest: &[&str]) -> Table {
    let mut t = Table::new().col(first, Align::Left);
    for &p in pcts {
        t = t.col(format!("{} {unit}", pct_label(p)), Align::Right);
    }
    for r in rest {
        t = t.col(*r, Align::Left);
    }
    t
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

/// The bucket rows of a distribution (non-empty ones unless `all_buckets`).
fn write_buckets(o: &mut String, d: &Distribution, all_buckets: bool) {
    use std::fmt::Write as _;
    let mut t = Table::new()
        .col("BUCKET", Align::Right)
        .col(format!("RANGE {}", d.unit), Align::Left)
        .col("COUNT", Align::Right)
        .col("%", Align::Right)
        .col("CUM %", Align::Right);
    let mut cum = 0u64;
    let n = d.bucket_counts.len();
    let total = d.count.max(1) as f64;
    for (i, &c) in d.bucket_counts.iter().enumerate() {
        cum += c;
        if c == 0 && !all_buckets {
            continue;
        }
        let tag = match i {
            0 => " underflow",
            i if i == n - 1 => " overflow",
            _ => "",
        };
        t.row([
            i.to_string(),
            format!(
                "[{}, {}){tag}",
                fmt_bound(d.bucket_options.lower(i)),
                fmt_bound(d.bucket_options.upper(i))
            ),
            c.to_string(),
            format!("{:.1}", 100.0 * c as f64 / total),
            format!("{:.1}", 100.0 * cum as f64 / total),
        ]);
    }
    indent(o, &t);
    if d.count == 0 {
        let _ = writeln!(o, "  (no samples)");
    }
    if d.rejected > 0 {
        let _ = writeln!(o, "  {} rejected (not finite)", count(d.rejected, "value"));
    }
}

/// A table's lines, indented by two spaces.
fn indent(o: &mut String, t: &Table) {
    for l in t.render().lines() {
        o.push_str("  ");
        o.push_str(l);
        o.push('\n');
    }
}

/// The human table for one report.
/// `--format csv`: one row per bucket (empty ones too) of every view's distribution, bounds in
/// microseconds (empty for the infinite ends).
pub fn buckets_csv(reports: &[BucketReport]) -> String {
    let heads = [
        "view",
        "bucket",
        "lower_us",
        "upper_us",
        "count",
        "cumulative_fraction",
    ];
    let mut t = heads
        .into_iter()
        .fold(Table::new(), |t, h| t.col(h, Align::Right));
    for r in reports {
        let d = &r.distribution;
        let bound = |b: f64| {
            if b.is_finite() {
                d.unit.to_us(b).to_string()
            } else {
                String::new()
            }
        };
        let mut cum = 0u64;
        for (i, &c) in d.bucket_counts.iter().enumerate() {
            cum += c;
            let frac = if d.count > 0 {
                cum as f64 / d.count as f64
            } else {
                0.0
            };
            t.row([
                r.name.clone(),
                i.to_string(),
                bound(d.bucket_options.lower(i)),
                bound(d.bucket_options.upper(i)),
                c.to_string(),
                frac.to_string(),
            ]);
        }
    }
    t.csv()
}

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
    write_buckets(&mut o, d, all_buckets);
    let _ = writeln!(o, "percentiles:");
    let mut t = pct_table("LENS", &r.percentiles, unit, &["METHOD"]);
    for l in &r.lenses {
        let name = match l.lens {
            Lens::Exact => "exact",
            Lens::Cloud => "cloud",
            Lens::Netperf => "netperf",
        };
        let mut cells = vec![name.to_string()];
        for (v, open) in l.values_us.iter().zip(&l.open_above) {
            cells.push(pct_cell(*v, *open, unit));
        }
        cells.push(l.method.clone());
        t.row(cells);
    }
    indent(&mut o, &t);
    if r.aligned.len() > 1 {
        write_aligned(&mut o, r);
    }
    o
}

/// The aligned series: the cloud's percentiles per alignment period.
fn write_aligned(o: &mut String, r: &BucketReport) {
    use std::fmt::Write as _;
    let unit = r.distribution.unit;
    let _ = writeln!(
        o,
        "aligned series (period {} s, ALIGN_PERCENTILE per period, stamped at the period end):",
        fmt_bound(r.alignment_period_s)
    );
    let mut t = Table::new()
        .col("END s", Align::Right)
        .col("COUNT", Align::Right);
    for &p in &r.percentiles {
        t = t.col(format!("{} {unit}", pct_label(p)), Align::Right);
    }
    for row in &r.aligned {
        let mut cells = vec![fmt_bound(row.end_s), row.count.to_string()];
        cells.extend(row.values_us.iter().map(|v| pct_cell(*v, false, unit)));
        t.row(cells);
    }
    indent(o, &t);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::results::Sample;
    use crate::analysis::results::{ViewKind, ViewSeries};

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
        assert!(t.contains(">=2.000"), "{t}");
        assert!(t.contains("overflow"), "{t}");
    }

    #[test]
    fn result_files_give_one_set_per_view_and_aligned_rows() {
        let mut r = RunResult::new("test", serde_json::json!({}));
        let mut v = ViewSeries::new("sampler", ViewKind::Sampler);
        // 0-60 s: 0.2 ms; 60-120 s: 3 ms.
        v.samples = (0..120)
            .map(|i| Sample::at_s(i as f64, if i < 60 { 200.0 } else { 3000.0 }))
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
        let mut c = ViewSeries::new("tcp client", ViewKind::Tcp);
        c.side = Some("client".into());
        c.flow = Some("10.99.0.1:40000 -> 10.99.0.2:5001".into());
        c.samples = (0..1000)
            .map(|i| Sample::at_s(i as f64 * 0.05, 100.0 + 200.0 * i as f64 / 999.0))
            .collect();
        // Outside the first minute: not in the window.
        c.samples.push(Sample::at_s(90.0, 9000.0));
        let mut sv = ViewSeries::new("tcp server", ViewKind::Tcp);
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
