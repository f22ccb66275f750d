//! Cloud Monitoring files (docs/cloud.md): each point of a projects.timeSeries.list response
//! with its percentiles from the file's buckets, local samples of the same window beside it
//! (exactly and through the cloud's buckets), the notes on why they differ, and its text.
use serde::Serialize;

use super::render::{fmt_bound, indent, pct_cell, pct_label, pct_table, write_buckets};
use crate::analysis::cloud_monitoring::{self, CloudPoint, CloudSeries, PointValue};
use crate::analysis::dist::{self, Distribution, ValueUnit};
use crate::analysis::input::SampleSet;
// The one percentile of exact samples (docs/results.md): the nearest rank, an observed value.
use crate::analysis::stats::percentile_sorted as nearest_rank;
use crate::sinks::table::{count, Table};

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
