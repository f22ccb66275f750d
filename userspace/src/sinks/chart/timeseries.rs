//! The time series: RTT over time, one series per view (thinned to each time bin's extremes),
//! on a log RTT axis when the views differ by orders of magnitude.
use std::ops::Range;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::axes::{pad, points, Pt, LOG_AXIS_RATIO};
use super::style::{color, derr, fmt_tick, font, legend};
use super::text::label;
use crate::analysis::results::ViewSeries;

/// At most ~2 points per bin: the min and max of each time bin, so spikes survive thinning. Works
/// from the samples in place (no copy of a long series).
pub(super) fn envelope(v: &ViewSeries, bins: usize) -> Vec<(f64, f64)> {
    let bins = bins.max(1);
    let (n, t0, t1) = points(v).fold(
        (0usize, f64::INFINITY, f64::NEG_INFINITY),
        |(n, a, b), p| (n + 1, a.min(p.0), b.max(p.0)),
    );
    if n <= bins * 2 {
        return points(v).collect();
    }
    let width = ((t1 - t0) / bins as f64).max(f64::MIN_POSITIVE);
    let mut acc: Vec<Option<(Pt, Pt)>> = vec![None; bins];
    for p in points(v) {
        let k = (((p.0 - t0) / width) as usize).min(bins - 1);
        acc[k] = Some(match acc[k] {
            None => (p, p),
            Some((lo, hi)) => (
                if p.1 < lo.1 { p } else { lo },
                if p.1 > hi.1 { p } else { hi },
            ),
        });
    }
    let mut out = Vec::with_capacity(bins * 2);
    for (lo, hi) in acc.into_iter().flatten() {
        if lo.0 <= hi.0 {
            out.push(lo);
            out.push(hi);
        } else {
            out.push(hi);
            out.push(lo);
        }
    }
    out
}

pub(super) fn timeseries<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    views: &[(usize, &ViewSeries)],
) -> anyhow::Result<()> {
    let all = views.iter().flat_map(|(_, v)| points(v));
    let (mut t0, mut t1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, 0.0f64);
    for (t, ms) in all {
        t0 = t0.min(t);
        t1 = t1.max(t);
        if ms > 0.0 {
            y0 = y0.min(ms);
        }
        y1 = y1.max(ms);
    }
    if y0.is_finite() && y1 / y0 > LOG_AXIS_RATIO {
        let floor = y0 / 1.3;
        let y = (floor..y1 * 1.3).log_scale();
        timeseries_on(area, views, pad(t0, t1), y, "RTT (ms, log scale)", floor)
    } else {
        let y1 = if y1 > 0.0 { y1 * 1.08 } else { 1.0 };
        timeseries_on(area, views, pad(t0, t1), 0.0..y1, "RTT (ms)", 0.0)
    }
}

/// The chart on the time axis `x` and RTT axis `y` (described `y_desc`; RTTs below `floor` drawn at
/// it, for the log axis): its caption and mesh, then each view with samples, thinned to the
/// extremes of one time bin per pixel of the area's width (at least 100 bins), and the legend.
fn timeseries_on<DB: DrawingBackend, Y>(
    area: &DrawingArea<DB, Shift>,
    views: &[(usize, &ViewSeries)],
    x: Range<f64>,
    y: Y,
    y_desc: &str,
    floor: f64,
) -> anyhow::Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption("RTT over time", font(18))
        .margin(12)
        .x_label_area_size(46)
        .y_label_area_size(76)
        .build_cartesian_2d(x, y)
        .map_err(derr)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .x_label_formatter(&|v| fmt_tick(*v))
        .y_desc(y_desc)
        .axis_desc_style(font(16))
        .label_style(font(13))
        .y_label_formatter(&|v| fmt_tick(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(derr)?;
    let bins = (area.dim_in_pixel().0 as usize).max(100);
    for &(i, v) in views {
        if v.samples.is_empty() {
            continue;
        }
        let c = color(i);
        let pts: Vec<Pt> = envelope(v, bins)
            .into_iter()
            .map(|(t, ms)| (t, ms.max(floor)))
            .collect();
        draw_view(&mut chart, v, &pts, c)?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// One view's points `pts` in colour `c`: dots, joined by thin lines only when the series is
/// sparse (at most 400 points; dense ones read better as dots), and its legend entry.
fn draw_view<'a, DB: DrawingBackend + 'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, DB, CT>,
    v: &ViewSeries,
    pts: &[Pt],
    c: RGBColor,
) -> anyhow::Result<()> {
    if pts.len() <= 400 {
        chart
            .draw_series(LineSeries::new(
                pts.iter().copied(),
                c.mix(0.4).stroke_width(1),
            ))
            .map_err(derr)?;
    }
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 2, c.filled())))
        .map_err(derr)?
        .label(label(v))
        .legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (20, 0)], c.stroke_width(2))
                + Circle::new((10, 0), 3, c.filled())
        });
    Ok(())
}
