//! The CDF: the fraction of samples at or below an RTT, log RTT axis, and a cloud distribution
//! beside them (`--cloud FILE`), uniform inside each of its buckets.
use std::path::Path;

use anyhow::bail;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::axes::rtt_ms;
use super::style::{color, derr, fmt_tick, font, legend};
use super::text::{label, short};
use crate::analysis::results::ViewSeries;

/// A cloud distribution as CDF points from its bucket counts: (RTT us, fraction at or below) at
/// each bucket bound ([`crate::analysis::cloud_monitoring::cdf_points_us`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CloudCdf {
    pub label: String,
    pub points_us: Vec<(f64, f64)>,
}

impl CloudCdf {
    /// The distribution points of a Cloud Monitoring file, merged.
    pub fn from_file(path: &Path) -> anyhow::Result<CloudCdf> {
        use crate::analysis::cloud_monitoring as cm;
        let name = path.display().to_string();
        let text = crate::sys::files::read_to_string(path)?;
        let m = cm::merge_file(&cm::parse(&text, &name)?);
        let Some(d) = m.distribution else {
            bail!("{name} holds no distribution point to draw (already-aligned values carry no buckets)");
        };
        Ok(CloudCdf {
            label: format!(
                "cloud ({} in {}, buckets {})",
                crate::sinks::table::count(d.count, "sample"),
                crate::sinks::table::count(m.points as u64, "point"),
                short(&d.bucket_options.spec(), 40)
            ),
            points_us: cm::cdf_points_us(&d),
        })
    }
}

/// The empirical CDF as at most `max` points (x in ms, y = fraction <= x).
pub(super) fn cdf_points(v: &ViewSeries, max: usize) -> Vec<(f64, f64)> {
    let mut xs: Vec<f64> = v.samples.iter().filter_map(|s| rtt_ms(s.rtt_us)).collect();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max.max(1)).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (xs[i], (i + 1) as f64 / n as f64))
        .collect();
    if out.last().map(|p| p.1) != Some(1.0) {
        out.push((xs[n - 1], 1.0));
    }
    out
}

/// The CDF chart's coordinates: RTT in ms on a log axis, the fraction of samples linear.
type CdfChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, RangedCoordf64>>;

/// The CDF of each view's samples as steps, with the cloud distribution (if any) beside them.
pub(super) fn cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    views: &[(usize, &ViewSeries)],
    cloud: Option<&CloudCdf>,
) -> anyhow::Result<()> {
    let cloud_pts = cloud.map(cloud_points_ms).unwrap_or_default();
    let (lo, hi) = rtt_extent_ms(&cloud_pts, views);
    // A log RTT axis: views that differ by orders of magnitude stay readable.
    let x_range = (lo / 1.3)..(hi * 1.3);
    let mut chart = ChartBuilder::on(area)
        .caption("CDF of RTT samples", font(18))
        .margin(12)
        .x_label_area_size(46)
        .y_label_area_size(76)
        .build_cartesian_2d(x_range.log_scale(), 0.0..1.02)
        .map_err(derr)?;
    chart
        .configure_mesh()
        .x_desc("RTT (ms, log scale)")
        .y_desc("fraction of samples <= RTT")
        .axis_desc_style(font(16))
        .label_style(font(13))
        .x_label_formatter(&|v| fmt_tick(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(derr)?;
    for &(i, v) in views {
        draw_view_steps(&mut chart, i, v, lo / 1.3)?;
    }
    if let Some(c) = cloud.filter(|_| !cloud_pts.is_empty()) {
        draw_cloud(&mut chart, c, &cloud_pts, lo / 1.3)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// The cloud distribution's points in ms with the fraction clamped to [0, 1] (finite ones only).
fn cloud_points_ms(c: &CloudCdf) -> Vec<(f64, f64)> {
    c.points_us
        .iter()
        .filter_map(|&(us, y)| Some((rtt_ms(us)?, y.clamp(0.0, 1.0))))
        .filter(|p| p.1.is_finite())
        .collect()
}

/// The RTT axis's extent in ms: the smallest positive and the largest RTT of the cloud points
/// and the views' samples (1 us when none is positive), at least 1.5 times apart.
fn rtt_extent_ms(cloud_pts: &[(f64, f64)], views: &[(usize, &ViewSeries)]) -> (f64, f64) {
    let mut lo = f64::INFINITY;
    let mut hi = 0.0f64;
    let samples = views
        .iter()
        .flat_map(|(_, v)| v.samples.iter().filter_map(|s| rtt_ms(s.rtt_us)));
    for ms in cloud_pts.iter().map(|p| p.0).chain(samples) {
        if ms > 0.0 {
            lo = lo.min(ms);
        }
        hi = hi.max(ms);
    }
    if !lo.is_finite() {
        lo = 0.001;
    }
    (lo, hi.max(lo * 1.5))
}

/// One view's empirical CDF as steps (it jumps at each sample), in colour `i`, with its legend
/// entry; samples left of the axis (`left` ms) are drawn at its edge.
fn draw_view_steps<DB: DrawingBackend>(
    chart: &mut CdfChart<'_, DB>,
    i: usize,
    v: &ViewSeries,
    left: f64,
) -> anyhow::Result<()> {
    let pts: Vec<(f64, f64)> = cdf_points(v, 2000)
        .into_iter()
        .map(|(x, y)| (x.max(left), y))
        .collect();
    if pts.is_empty() {
        return Ok(());
    }
    let c = color(i);
    // Steps: the CDF jumps at each sample.
    let mut stepped = Vec::with_capacity(pts.len() * 2 + 1);
    stepped.push((pts[0].0, 0.0));
    let mut prev = 0.0;
    for (x, y) in pts {
        stepped.push((x, prev));
        stepped.push((x, y));
        prev = y;
    }
    chart
        .draw_series(LineSeries::new(stepped, c.stroke_width(2)))
        .map_err(derr)?
        .label(label(v))
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    Ok(())
}

/// The cloud distribution in black: its CDF curve (with its legend entry) and a dot at each
/// bucket bound right of the axis's edge `left` ms.
fn draw_cloud<DB: DrawingBackend>(
    chart: &mut CdfChart<'_, DB>,
    c: &CloudCdf,
    cloud_pts: &[(f64, f64)],
    left: f64,
) -> anyhow::Result<()> {
    // Uniform inside each bucket (what the percentile aligner assumes): linear in the RTT,
    // so a curve on this log axis, drawn through many points; a dot at each bucket bound.
    let curve = cloud_curve(cloud_pts, left, 64);
    chart
        .draw_series(LineSeries::new(curve, BLACK.stroke_width(2)))
        .map_err(derr)?
        .label(short(&c.label, 80))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    chart
        .draw_series(
            cloud_pts
                .iter()
                .filter(|p| p.0 >= left)
                .map(|&p| Circle::new(p, 3, BLACK.filled())),
        )
        .map_err(derr)?;
    Ok(())
}

/// The cloud distribution's CDF as drawn on a log RTT axis starting at `left` ms: between two
/// bucket bounds (x0, y0), (x1, y1) the samples are uniform (the percentile aligner's
/// assumption), F(x) = y0 + (y1 - y0) (x - x0) / (x1 - x0), sampled at `per_bucket` points spaced
/// evenly on the log axis. A bucket starting at 0 (or left of the axis) is drawn from `left`,
/// where F is small, not from its lower bound's value clamped to the edge.
fn cloud_curve(bounds_ms: &[(f64, f64)], left: f64, per_bucket: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let per_bucket = per_bucket.max(1);
    for w in bounds_ms.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x1 <= left || x1 <= x0 {
            continue;
        }
        let f = |x: f64| y0 + (y1 - y0) * (x - x0) / (x1 - x0);
        let start = x0.max(left);
        let ratio = (x1 / start).powf(1.0 / per_bucket as f64);
        let mut x = start;
        for _ in 0..per_bucket {
            out.push((x, f(x)));
            x *= ratio;
        }
        out.push((x1, y1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_cdf_is_uniform_inside_each_bucket_on_the_log_axis() {
        // 100 samples in [0, 1) ms, 100 in [1, 2) ms: F(0.1 ms) = 0.05, F(0.5) = 0.25, F(1.5) = 0.75.
        let bounds = [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0)];
        let curve = cloud_curve(&bounds, 0.01, 64);
        // The value at x as drawn: linear between curve points on the log axis.
        let at = |x: f64| {
            let w = curve
                .windows(2)
                .find(|w| w[0].0 <= x && x <= w[1].0)
                .unwrap_or_else(|| panic!("{x} not on the curve {curve:?}"));
            let t = (x.ln() - w[0].0.ln()) / (w[1].0.ln() - w[0].0.ln());
            w[0].1 + t * (w[1].1 - w[0].1)
        };
        for (x, want) in [
            (0.1, 0.05),
            (0.5, 0.25),
            (1.0, 0.5),
            (1.5, 0.75),
            (2.0, 1.0),
        ] {
            let got = at(x);
            assert!((got - want).abs() < 0.002, "F({x} ms) = {got}, want {want}");
        }
        // It starts at the axis' left edge near 0, not at the bucket's upper value.
        assert_eq!(curve[0].0, 0.01);
        assert!(curve[0].1 < 0.01, "{:?}", curve[0]);
        // The fixture's cloud file draws the same way through the chart.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cloud");
        let c = CloudCdf::from_file(&dir.join("explicit-vm_flow.json")).unwrap();
        let ms: Vec<(f64, f64)> = c.points_us.iter().map(|&(u, y)| (u / 1000.0, y)).collect();
        let curve = cloud_curve(&ms, 0.01, 64);
        assert!(curve
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1 + 1e-12));
    }
}
