//! The sweep: RTT on a log axis against the swept parameter, a p50 line per view and its
//! p5-p95 range as a band (or a whisker where too few samples back it).
use std::ops::Range;

use anyhow::bail;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::axes::{axis_value, pad, rtt_ms, LOG_AXIS_RATIO};
use super::style::{color, derr, fmt_tick, font, legend};
use super::text::{full_name, short};
use crate::analysis::results::{RunResult, Sweep, ViewKind};

/// x, p5, p50, p95 (ms) and the sample count of one view at one sweep point.
type SweepRow = (f64, Option<f64>, Option<f64>, Option<f64>, u64);

/// Fewest samples at a sweep point for its p5-p95 range to join a band with its neighbour's;
/// below it (a handful of handshake samples) the range is a whisker at the point alone.
pub const MIN_BAND_SAMPLES: u64 = 20;

/// How a view's p5-p95 ranges are drawn along a sweep (rows sorted by x): runs of at least two
/// consecutive points each with `min_n` samples or more become a band; every other point with a
/// range gets a whisker of its own. Indices into `rows`.
fn band_runs(rows: &[SweepRow], min_n: u64) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut runs: Vec<Vec<usize>> = Vec::new();
    let mut whiskers = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let close = |cur: &mut Vec<usize>, runs: &mut Vec<Vec<usize>>, whiskers: &mut Vec<usize>| {
        match cur.len() {
            0 => {}
            1 => whiskers.push(cur[0]),
            _ => runs.push(cur.clone()),
        }
        cur.clear();
    };
    for (i, r) in rows.iter().enumerate() {
        let has_range = r.1.is_some() && r.3.is_some();
        if has_range && r.4 >= min_n {
            cur.push(i);
            continue;
        }
        close(&mut cur, &mut runs, &mut whiskers);
        if has_range {
            whiskers.push(i);
        }
    }
    close(&mut cur, &mut runs, &mut whiskers);
    whiskers.sort_unstable();
    (runs, whiskers)
}

/// The sweep chart: each view's p50 line and p5-p95 range against the swept parameter, on a
/// log x axis when the parameter spans decades.
pub(super) fn sweep<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    result: &RunResult,
    views: &[String],
) -> anyhow::Result<()> {
    let sw = result.sweep.as_ref().expect("plan checked the sweep");
    let names = sweep_views(sw, views);
    let color_of = |name: &str, k: usize| {
        result
            .views
            .iter()
            .position(|v| v.name == name)
            .map_or(color(k + result.views.len()), color)
    };
    let ((x0, x1), (y0, y1)) = sweep_extent(sw, &names);
    if !y0.is_finite() {
        bail!("the sweep has no positive RTT percentiles to chart");
    }
    let y_range = (y0 / 1.5)..(y1.max(y0 * 1.5) * 1.5);
    let x_desc = if sw.unit.is_empty() {
        short(&sw.parameter, 60)
    } else {
        format!("{} ({})", short(&sw.parameter, 60), short(&sw.unit, 20))
    };
    let colors: Vec<RGBColor> = names
        .iter()
        .enumerate()
        .map(|(k, n)| color_of(n, k))
        .collect();
    // Parameters swept over decades (the seed's 100..5000 ms intervals) get a log axis too.
    if x0 > 0.0 && x1 / x0 >= LOG_AXIS_RATIO {
        let x = ((x0 / 1.2)..(x1 * 1.2)).log_scale();
        let desc = format!("{x_desc}, log scale");
        sweep_on(area, sw, &names, &colors, (x, desc, 5), y_range)
    } else {
        sweep_on(
            area,
            sw,
            &names,
            &colors,
            (pad(x0, x1), x_desc, 10),
            y_range,
        )
    }
}

/// The views to draw (all, or those in `views`), in order of first appearance in the sweep.
fn sweep_views<'a>(sw: &'a Sweep, views: &[String]) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for p in &sw.points {
        for s in &p.views {
            if !names.contains(&s.view.as_str()) && (views.is_empty() || views.contains(&s.view)) {
                names.push(&s.view);
            }
        }
    }
    names
}

/// The extent of the sweep's points: (smallest, largest) x and (smallest positive, largest)
/// p5/p50/p95 in ms of the `names` views; y's smallest is infinite when none is positive.
fn sweep_extent(sw: &Sweep, names: &[&str]) -> ((f64, f64), (f64, f64)) {
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, 0.0f64);
    for p in &sw.points {
        let Some(x) = axis_value(p.x) else { continue };
        x0 = x0.min(x);
        x1 = x1.max(x);
        for s in p.views.iter().filter(|s| names.contains(&s.view.as_str())) {
            for ms in [s.p5_us, s.p50_us, s.p95_us]
                .into_iter()
                .flatten()
                .filter_map(rtt_ms)
            {
                if ms > 0.0 {
                    y0 = y0.min(ms);
                }
                y1 = y1.max(ms);
            }
        }
    }
    ((x0, x1), (y0, y1))
}

/// Draw the sweep on an x axis `x` (linear or log) described by `x_desc` with `x_labels`
/// labels, RTT on a log axis over `y_range`: the mesh, then each view in its colour.
fn sweep_on<DB: DrawingBackend, X>(
    area: &DrawingArea<DB, Shift>,
    sw: &Sweep,
    names: &[&str],
    colors: &[RGBColor],
    (x, x_desc, x_labels): (X, String, usize),
    y_range: Range<f64>,
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let floor = y_range.start;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "RTT against {}: p50 line; p5-p95 as a band (>= {MIN_BAND_SAMPLES} samples at neighbouring points) or a whisker",
                short(&sw.parameter, 60)
            ),
            font(18),
        )
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y_range.log_scale())
        .map_err(derr)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .x_labels(x_labels)
        .y_desc("RTT (ms, log scale)")
        .axis_desc_style(font(16))
        .label_style(font(13))
        .x_label_formatter(&|v| fmt_tick(*v))
        .y_label_formatter(&|v| fmt_tick(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(derr)?;
    for (name, &c) in names.iter().zip(colors) {
        let (rows, kind) = view_rows(sw, name, floor);
        draw_ranges(&mut chart, &rows, c)?;
        let label = format!("{}: p50", full_name(name, kind));
        draw_p50(&mut chart, &rows, label, c)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// One view's rows along the sweep, sorted by x, percentiles in ms raised to the axis's `floor`,
/// and the view's kind (the first point that names one).
fn view_rows(sw: &Sweep, name: &str, floor: f64) -> (Vec<SweepRow>, Option<ViewKind>) {
    let mut kind = None;
    let mut rows: Vec<SweepRow> = sw
        .points
        .iter()
        .filter_map(|p| {
            let x = axis_value(p.x)?;
            p.views.iter().find(|s| s.view == name).map(|s| {
                kind = kind.or(s.kind);
                let ms = |v: Option<f64>| v.and_then(rtt_ms).map(|v| v.max(floor));
                (x, ms(s.p5_us), ms(s.p50_us), ms(s.p95_us), s.count)
            })
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    (rows, kind)
}

/// One view's p5-p95 ranges in colour `c`: a band over each run of well-backed points
/// ([`band_runs`]), a whisker at every other point with a range.
fn draw_ranges<DB: DrawingBackend, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'_, DB, CT>,
    rows: &[SweepRow],
    c: RGBColor,
) -> anyhow::Result<()> {
    let (runs, whiskers) = band_runs(rows, MIN_BAND_SAMPLES);
    for run in &runs {
        let mut poly: Vec<(f64, f64)> = run
            .iter()
            .filter_map(|&i| Some((rows[i].0, rows[i].3?)))
            .collect();
        poly.extend(
            run.iter()
                .rev()
                .filter_map(|&i| Some((rows[i].0, rows[i].1?))),
        );
        chart
            .draw_series(std::iter::once(Polygon::new(poly, c.mix(0.18).filled())))
            .map_err(derr)?;
    }
    // A point alone (too few samples, or neighbours without a range): a whisker.
    chart
        .draw_series(whiskers.iter().filter_map(|&i| {
            let r = rows[i];
            Some(PathElement::new(
                vec![(r.0, r.1?), (r.0, r.3?)],
                c.mix(0.5).stroke_width(3),
            ))
        }))
        .map_err(derr)?;
    Ok(())
}

/// One view's p50 in colour `c`: a line through its points, a dot at each, and its legend
/// entry `label` (a band behind a line).
fn draw_p50<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    rows: &[SweepRow],
    label: String,
    c: RGBColor,
) -> anyhow::Result<()> {
    let line: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r.0, r.2?))).collect();
    chart
        .draw_series(LineSeries::new(line.iter().copied(), c.stroke_width(2)))
        .map_err(derr)?;
    chart
        .draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))
        .map_err(derr)?
        .label(label)
        .legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + Rectangle::new([(0, -6), (20, 6)], c.mix(0.18).filled())
                + PathElement::new(vec![(0, 0), (20, 0)], c.stroke_width(2))
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_bands_never_join_points_with_too_few_samples() {
        let row = |x: f64, n: u64| -> SweepRow { (x, Some(1.0), Some(2.0), Some(3.0), n) };
        // 16 ms and 32 ms with a handful of samples each, 39 and 41 with plenty: no band across
        // a thin point; thin points and lone points are whiskers.
        let rows = [
            row(0.0, 300),
            row(16.0, 4),
            row(32.0, 3),
            row(39.0, 300),
            row(41.0, 290),
            row(50.0, 5),
        ];
        let (runs, whiskers) = band_runs(&rows, MIN_BAND_SAMPLES);
        assert_eq!(runs, vec![vec![3, 4]]);
        assert_eq!(whiskers, vec![0, 1, 2, 5]);
        for run in &runs {
            assert!(run.iter().all(|&i| rows[i].4 >= MIN_BAND_SAMPLES));
            assert!(
                run.windows(2).all(|w| w[1] == w[0] + 1),
                "a band joins neighbours only"
            );
        }
        // A point without p5/p95 breaks a band and has no whisker.
        let mut gap = rows;
        gap[4].1 = None;
        let (runs, whiskers) = band_runs(&gap, MIN_BAND_SAMPLES);
        assert!(runs.is_empty(), "{runs:?}");
        assert_eq!(whiskers, vec![0, 1, 2, 3, 5]);
    }
}
