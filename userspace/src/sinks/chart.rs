//! `rttscope chart`: draw a saved result (no privileges needed) to PNG or SVG.
//!
//! Kinds: `timeseries` (RTT over time, one series per view), `cdf` (fraction of samples at or
//! below an RTT, log RTT axis), `overview` (time series above CDF), `sweep` (RTT on a log axis
//! against the swept parameter: p50 line and p5-p95 band per view, like the ACM Queue figure).
//! `auto` picks `sweep` when the result has a sweep, `overview` otherwise.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (`userspace/assets/`, Bitstream Vera
//! license), so rendering needs no system font libraries.
use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail, Context};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::analysis::results::{RunResult, ViewSeries};

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
static FONT_ONCE: Once = Once::new();

/// Register the embedded font as plotters' `sans-serif` (idempotent).
pub fn register_font() {
    FONT_ONCE.call_once(|| {
        // The font is compiled in; failing to parse it would be a build defect.
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::error!("the embedded chart font could not be parsed");
        }
    });
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChartKind {
    Auto,
    Timeseries,
    Cdf,
    Overview,
    Sweep,
}

/// What to draw, independent of the output format.
#[derive(Debug, Clone)]
pub struct ChartOptions {
    pub kind: ChartKind,
    pub views: Vec<String>,
    pub title: Option<String>,
    pub size: (u32, u32),
    /// A cloud distribution drawn in the CDF (`--cloud FILE`).
    pub cloud: Option<CloudCdf>,
}

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

impl Default for ChartOptions {
    fn default() -> Self {
        ChartOptions {
            kind: ChartKind::Auto,
            views: Vec::new(),
            title: None,
            size: (1200, 800),
            cloud: None,
        }
    }
}

/// Output format, from a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Svg,
}

impl ImageFormat {
    pub fn from_path(p: &Path) -> anyhow::Result<ImageFormat> {
        match p
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase())
            .as_deref()
        {
            Some("png") => Ok(ImageFormat::Png),
            Some("svg") => Ok(ImageFormat::Svg),
            _ => bail!(
                "cannot tell the image format of {}: name it .png or .svg",
                p.display()
            ),
        }
    }
}

/// Render `result` into a PNG or SVG file (format from the extension).
pub fn render_file(result: &RunResult, opts: &ChartOptions, path: &Path) -> anyhow::Result<()> {
    let format = ImageFormat::from_path(path)?;
    // Check what will be drawn, and where, before creating the file.
    plan(result, opts)?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "cannot write {}: directory {} does not exist",
            path.display(),
            parent.display()
        );
    }
    let ctx = || format!("writing the chart to {}", path.display());
    let bytes = match format {
        ImageFormat::Png => render_png(result, opts)?,
        ImageFormat::Svg => render_svg_string(result, opts)?.into_bytes(),
    };
    crate::sys::files::write_atomically(path, &bytes).with_context(ctx)
}

/// Render into a PNG file's bytes in memory (written atomically by `render_file`).
pub fn render_png(result: &RunResult, opts: &ChartOptions) -> anyhow::Result<Vec<u8>> {
    use image::ImageEncoder;
    let rgb = render_rgb(result, opts)?;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&rgb, opts.size.0, opts.size.1, image::ColorType::Rgb8)
        .map_err(|e| anyhow!("encoding PNG: {e}"))?;
    Ok(png)
}

/// Render into an SVG document in memory.
pub fn render_svg_string(result: &RunResult, opts: &ChartOptions) -> anyhow::Result<String> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, opts.size).into_drawing_area();
        draw(&root, result, opts)?;
        root.present().map_err(|e| anyhow!("rendering SVG: {e}"))?;
    }
    Ok(s)
}

/// Render into an RGB buffer of `size.0 * size.1 * 3` bytes.
pub fn render_rgb(result: &RunResult, opts: &ChartOptions) -> anyhow::Result<Vec<u8>> {
    let (w, h) = opts.size;
    let mut buf = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        draw(&root, result, opts)?;
        root.present()
            .map_err(|e| anyhow!("rendering bitmap: {e}"))?;
    }
    Ok(buf)
}

/// The chart kind that will be drawn and the views in it.
fn plan<'a>(
    result: &'a RunResult,
    opts: &ChartOptions,
) -> anyhow::Result<(ChartKind, Vec<(usize, &'a ViewSeries)>)> {
    for v in &opts.views {
        let in_views = result.views.iter().any(|s| &s.name == v);
        let in_sweep = result.sweep.as_ref().is_some_and(|sw| {
            sw.points
                .iter()
                .any(|p| p.views.iter().any(|s| &s.view == v))
        });
        if !in_views && !in_sweep {
            let names: Vec<&str> = result.views.iter().map(|s| s.name.as_str()).collect();
            bail!(
                "the result has no view '{}' (views: {})",
                short(v, 60),
                short(&names.join(", "), 200)
            );
        }
    }
    let mut views: Vec<(usize, &ViewSeries)> = result
        .views
        .iter()
        .enumerate()
        .filter(|(_, v)| opts.views.is_empty() || opts.views.contains(&v.name))
        .collect();
    // Series that kept only a summary (observe's per-flow series) are not drawn unless named.
    if opts.views.is_empty() && views.iter().any(|(_, v)| !v.samples.is_empty()) {
        views.retain(|(_, v)| !v.samples.is_empty());
    }
    let has_sweep = result.sweep.as_ref().is_some_and(|s| !s.points.is_empty());
    let kind = match opts.kind {
        ChartKind::Auto if has_sweep => ChartKind::Sweep,
        ChartKind::Auto => ChartKind::Overview,
        k => k,
    };
    if kind == ChartKind::Sweep {
        if !has_sweep {
            bail!("the result has no sweep to chart (use --kind timeseries or cdf)");
        }
    } else if views.iter().all(|(_, v)| points(v).next().is_none()) {
        bail!("the result has no samples to chart");
    }
    Ok((kind, views))
}

/// Colours that stay distinct for colour-blind readers (Okabe-Ito), then a fallback palette.
fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 7] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 0, 0),
    ];
    if i < C.len() {
        C[i]
    } else {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    }
}

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().into()
}

fn derr<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow!("drawing the chart failed: {e}")
}

/// Draw `result` on any plotters drawing area.
pub fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    result: &RunResult,
    opts: &ChartOptions,
) -> anyhow::Result<()> {
    register_font();
    let (kind, views) = plan(result, opts)?;
    root.fill(&WHITE).map_err(derr)?;
    let title = short(
        &opts.title.clone().unwrap_or_else(|| result.display_title()),
        120,
    );
    let subtitle = subtitle(
        &result.settings_line(),
        subtitle_chars(root.dim_in_pixel().0),
    );
    let (w, _) = root.dim_in_pixel();
    let head = if subtitle.is_empty() { 44 } else { 68 };
    let (top, body) = root.split_vertically(head);
    let center = Pos::new(HPos::Center, VPos::Top);
    top.draw(&Text::new(
        title,
        (w as i32 / 2, 8),
        font(24).pos(center).color(&BLACK),
    ))
    .map_err(derr)?;
    if !subtitle.is_empty() {
        top.draw(&Text::new(
            subtitle,
            (w as i32 / 2, 40),
            font(15).pos(center).color(&RGBColor(80, 80, 80)),
        ))
        .map_err(derr)?;
    }
    match kind {
        ChartKind::Timeseries => timeseries(&body, &views),
        ChartKind::Cdf => cdf(&body, &views, opts.cloud.as_ref()),
        ChartKind::Overview => {
            let (a, b) = body.split_vertically(body.dim_in_pixel().1 / 2);
            timeseries(&a, &views)?;
            cdf(&b, &views, opts.cloud.as_ref())
        }
        ChartKind::Sweep => sweep(&body, result, opts),
        ChartKind::Auto => unreachable!("plan resolves auto"),
    }
}

/// How many characters of the 15 px subtitle fit across `width` pixels (~8 px a character).
fn subtitle_chars(width: u32) -> usize {
    (width.saturating_sub(40) / 8).max(20) as usize
}

/// The settings in the user's words, cut between two settings (never inside a word) to
/// `max` characters: `interval_ns=10000000` reads `interval 10ms`, `length_s=3` reads
/// `length 3s`; what does not fit is counted (`+N more`).
fn subtitle(settings_line: &str, max: usize) -> String {
    let words: Vec<String> = settings_line
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(user_words)
        .collect();
    let mut out = String::new();
    for (i, w) in words.iter().enumerate() {
        let more = words.len() - i;
        let tail = if more > 1 { 12 } else { 0 };
        let sep = if out.is_empty() { 0 } else { 2 };
        if out.chars().count() + sep + w.chars().count() + tail > max {
            out.push_str(&format!(
                "{}+{more} more",
                if out.is_empty() { "" } else { ", " }
            ));
            return out;
        }
        if sep > 0 {
            out.push_str(", ");
        }
        out.push_str(w);
    }
    out
}

/// One `key=value` setting in the user's words: durations kept in a unit suffix of the key
/// (`_ns`, `_us`, `_ms`, `_s`) as a duration, the rest as `key value`.
fn user_words(kv: &str) -> String {
    let Some((k, v)) = kv.split_once('=') else {
        return short(kv, 60);
    };
    let (k, v) = (short(k, 40), short(v, 60));
    let scale = [("_ns", 1.0), ("_us", 1e3), ("_ms", 1e6), ("_s", 1e9)]
        .into_iter()
        .find(|(suffix, _)| k.ends_with(suffix));
    if let (Some((suffix, ns_per)), Ok(x)) = (scale, v.parse::<f64>()) {
        let ns = x * ns_per;
        if ns.is_finite() && (0.0..1e18).contains(&ns) {
            let d = std::time::Duration::from_nanos(ns.round() as u64);
            return format!(
                "{} {}",
                k.trim_end_matches(suffix).replace('_', " "),
                crate::analysis::units::fmt_duration_short(d)
            );
        }
    }
    format!("{} {v}", k.replace('_', " "))
}

fn label(v: &ViewSeries) -> String {
    format!(
        "{} ({}, n={})",
        short(&v.name, 60),
        v.kind.as_str(),
        v.samples.len()
    )
}

/// Text from the result as drawn: at most `max` characters (then "..."), control characters as
/// spaces, so a hostile name cannot make text layout the slow part.
fn short(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(max).is_some() {
        out.truncate(
            out.char_indices()
                .nth(max - 3)
                .map_or(out.len(), |(i, _)| i),
        );
        out.push_str("...");
    }
    out
}

/// Largest magnitude drawn on the time and sweep-parameter axes; beyond it values are clamped
/// (`results::load` refuses them; library callers may pass anything).
const AXIS_MAX: f64 = crate::analysis::results::MAX_ABS_TIME;
/// Time and parameter values smaller than this in magnitude are drawn at 0.
const AXIS_TINY: f64 = 1e-9;
/// Positive RTTs are drawn between 1 ns and `MAX_RTT_US` (clamped): a subnormal RTT or an infinite
/// one must not reach the axis arithmetic, where plotters' tick loops never end.
const RTT_MIN_MS: f64 = 1e-6;
const RTT_MAX_MS: f64 = crate::analysis::results::MAX_RTT_US / 1000.0;

/// A time or parameter value as drawn: `None` for NaN, clamped to +-`AXIS_MAX`, tiny ones as 0.
fn axis_value(v: f64) -> Option<f64> {
    if v.is_nan() {
        return None;
    }
    let v = v.clamp(-AXIS_MAX, AXIS_MAX);
    Some(if v.abs() < AXIS_TINY { 0.0 } else { v })
}

/// An RTT in microseconds as drawn, in ms: `None` for NaN or negative, 0 stays 0, positive
/// values clamped to `RTT_MIN_MS..=RTT_MAX_MS`.
fn rtt_ms(us: f64) -> Option<f64> {
    if us.is_nan() || us < 0.0 {
        return None;
    }
    let ms = us / 1000.0;
    Some(if ms == 0.0 {
        0.0
    } else {
        ms.clamp(RTT_MIN_MS, RTT_MAX_MS)
    })
}

/// The drawable points of a view: (time s, RTT ms), cleaned as above.
fn points(v: &ViewSeries) -> impl Iterator<Item = Pt> + '_ {
    v.samples
        .iter()
        .filter_map(|s| Some((axis_value(s.t_s())?, rtt_ms(s.rtt_us)?)))
}

/// Padded range for an axis; never empty, never narrower than a millionth of its values'
/// magnitude (narrower spans cannot be divided into ticks in f64), never beyond +-`AXIS_MAX`.
fn pad(lo: f64, hi: f64) -> Range<f64> {
    if !(lo.is_finite() && hi.is_finite()) || lo > hi {
        return 0.0..1.0;
    }
    let (lo, hi) = (lo.clamp(-AXIS_MAX, AXIS_MAX), hi.clamp(-AXIS_MAX, AXIS_MAX));
    let span = hi - lo;
    let mag = lo.abs().max(hi.abs());
    let min_span = (mag * 1e-6).max(AXIS_TINY);
    if span < min_span {
        let d = if mag == 0.0 {
            1.0
        } else {
            (mag * 0.1).max(min_span)
        };
        return (lo - d)..(hi + d);
    }
    (lo - span * 0.03)..(hi + span * 0.05)
}

/// A point of a series: (x, y).
type Pt = (f64, f64);
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

/// A view's name as a legend says it: the name and what kind of measurement it is.
fn full_name(name: &str, kind: Option<crate::analysis::results::ViewKind>) -> String {
    use crate::analysis::results::ViewKind as K;
    let what = match kind {
        Some(K::Probe) => "request/response probe, send() to recv()",
        Some(K::Ping) => "ICMP echo probe",
        Some(K::Tcp) => "TCP view, the kernel's RTT samples",
        Some(K::Sampler) => "packet sampler at the interface",
        Some(K::Irtt) => "irtt probe",
        _ => return short(name, 60),
    };
    format!("{} ({what})", short(name, 40))
}

/// At most ~2 points per bin: the min and max of each time bin, so spikes survive thinning. Works
/// from the samples in place (no copy of a long series).
fn envelope(v: &ViewSeries, bins: usize) -> Vec<(f64, f64)> {
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

/// Views whose RTTs differ by more than this factor get a log RTT axis in the time series.
const LOG_AXIS_RATIO: f64 = 30.0;

fn timeseries<DB: DrawingBackend>(
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
        // Thin connecting lines for sparse series only; dense ones read better as dots.
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
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .label_font(font(14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(120, 120, 120))
        .draw()
        .map_err(derr)
}

/// The empirical CDF as at most `max` points (x in ms, y = fraction <= x).
fn cdf_points(v: &ViewSeries, max: usize) -> Vec<(f64, f64)> {
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

fn cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    views: &[(usize, &ViewSeries)],
    cloud: Option<&CloudCdf>,
) -> anyhow::Result<()> {
    let mut lo = f64::INFINITY;
    let mut hi = 0.0f64;
    let cloud_pts: Vec<(f64, f64)> = cloud
        .map(|c| {
            c.points_us
                .iter()
                .filter_map(|&(us, y)| Some((rtt_ms(us)?, y.clamp(0.0, 1.0))))
                .filter(|p| p.1.is_finite())
                .collect()
        })
        .unwrap_or_default();
    for &(ms, _) in &cloud_pts {
        if ms > 0.0 {
            lo = lo.min(ms);
        }
        hi = hi.max(ms);
    }
    for (_, v) in views {
        for ms in v.samples.iter().filter_map(|s| rtt_ms(s.rtt_us)) {
            if ms > 0.0 {
                lo = lo.min(ms);
            }
            hi = hi.max(ms);
        }
    }
    if !lo.is_finite() {
        lo = 0.001;
    }
    let hi = hi.max(lo * 1.5);
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
        let pts: Vec<(f64, f64)> = cdf_points(v, 2000)
            .into_iter()
            .map(|(x, y)| (x.max(lo / 1.3), y))
            .collect();
        if pts.is_empty() {
            continue;
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
    }
    if let Some(c) = cloud.filter(|_| !cloud_pts.is_empty()) {
        // Uniform inside each bucket (what the percentile aligner assumes): linear in the RTT,
        // so a curve on this log axis, drawn through many points; a dot at each bucket bound.
        let left = lo / 1.3;
        let curve = cloud_curve(&cloud_pts, left, 64);
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
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
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

fn fmt_tick(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else if v >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn sweep<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    result: &RunResult,
    opts: &ChartOptions,
) -> anyhow::Result<()> {
    let sw = result.sweep.as_ref().expect("plan checked the sweep");
    // The views in order of first appearance; colours follow the run's view order when it has one.
    let mut names: Vec<&str> = Vec::new();
    for p in &sw.points {
        for s in &p.views {
            if !names.contains(&s.view.as_str())
                && (opts.views.is_empty() || opts.views.contains(&s.view))
            {
                names.push(&s.view);
            }
        }
    }
    let color_of = |name: &str, k: usize| {
        result
            .views
            .iter()
            .position(|v| v.name == name)
            .map_or(color(k + result.views.len()), color)
    };
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

fn sweep_on<DB: DrawingBackend, X>(
    area: &DrawingArea<DB, Shift>,
    sw: &crate::analysis::results::Sweep,
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
        let mut kind = None;
        let mut rows: Vec<SweepRow> = sw
            .points
            .iter()
            .filter_map(|p| {
                let x = axis_value(p.x)?;
                p.views.iter().find(|s| s.view == *name).map(|s| {
                    kind = kind.or(s.kind);
                    let ms = |v: Option<f64>| v.and_then(rtt_ms).map(|v| v.max(floor));
                    (x, ms(s.p5_us), ms(s.p50_us), ms(s.p95_us), s.count)
                })
            })
            .collect();
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (runs, whiskers) = band_runs(&rows, MIN_BAND_SAMPLES);
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
        let line: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r.0, r.2?))).collect();
        chart
            .draw_series(LineSeries::new(line.iter().copied(), c.stroke_width(2)))
            .map_err(derr)?;
        chart
            .draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(derr)?
            .label(format!("{}: p50", full_name(name, kind)))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + Rectangle::new([(0, -6), (20, 6)], c.mix(0.18).filled())
                    + PathElement::new(vec![(0, 0), (20, 0)], c.stroke_width(2))
            });
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::results::{Sample, Sweep, SweepPoint, ViewKind, ViewSummary};
    use serde_json::json;

    fn result_with_views() -> RunResult {
        let mut r = RunResult::new("compare", json!({"interval": "10ms", "duration": "5s"}));
        r.title = Some("test run".into());
        let mut tcp = ViewSeries::new("tcp client", ViewKind::Tcp);
        tcp.samples = (0..500)
            .map(|i| Sample::at_s(i as f64 * 0.01, 120.0 + (i % 17) as f64 * 5.0))
            .collect();
        let mut sampler = ViewSeries::new("sampler", ViewKind::Sampler);
        sampler.samples = (0..50)
            .map(|i| Sample::at_s(i as f64 * 0.1, 40_000.0 + (i % 5) as f64 * 300.0))
            .collect();
        r.views = vec![tcp, sampler];
        r
    }

    fn result_with_sweep() -> RunResult {
        let mut r = RunResult::new("compare", json!({"sweep": "interval"}));
        let pts = [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 40.0, 41.0];
        r.sweep = Some(Sweep {
            parameter: "response/request interval".into(),
            unit: "ms".into(),
            points: pts
                .iter()
                .map(|&x| SweepPoint {
                    x,
                    settings: serde_json::Value::Null,
                    views: vec![
                        ViewSummary {
                            view: "tcp server".into(),
                            kind: Some(ViewKind::Tcp),
                            count: 100,
                            p5_us: Some(100.0 + x * 900.0),
                            p50_us: Some(150.0 + x * 1000.0),
                            p95_us: Some(300.0 + x * 1100.0),
                            ..Default::default()
                        },
                        ViewSummary {
                            view: "probe".into(),
                            count: 100,
                            p5_us: Some(80.0),
                            p50_us: Some(100.0 + x),
                            p95_us: Some(200.0 + x),
                            ..Default::default()
                        },
                    ],
                })
                .collect(),
        });
        r
    }

    fn small() -> ChartOptions {
        ChartOptions {
            size: (640, 480),
            ..Default::default()
        }
    }

    /// The buffer has ink: many distinct colours, not one uniform fill.
    fn assert_drawn(buf: &[u8]) {
        assert!(!buf.is_empty());
        let white = buf.chunks(3).filter(|p| *p == [255, 255, 255]).count();
        let total = buf.len() / 3;
        assert!(white < total, "the image is uniformly white");
        assert!(
            white > total / 2,
            "the background should be mostly white: {white}/{total}"
        );
        let mut colours: Vec<[u8; 3]> = buf.chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
        colours.sort();
        colours.dedup();
        assert!(colours.len() > 20, "only {} colours drawn", colours.len());
        // The first view's colour is present (the series were drawn, not only axes).
        let blue = buf.chunks(3).filter(|p| *p == [0, 114, 178]).count();
        assert!(blue > 50, "series colour found on only {blue} pixels");
    }

    #[test]
    fn renders_every_kind_into_a_buffer() {
        let r = result_with_views();
        for kind in [
            ChartKind::Auto,
            ChartKind::Timeseries,
            ChartKind::Cdf,
            ChartKind::Overview,
        ] {
            let buf = render_rgb(&r, &ChartOptions { kind, ..small() }).unwrap();
            assert_eq!(buf.len(), 640 * 480 * 3);
            assert_drawn(&buf);
        }
        let s = result_with_sweep();
        let buf = render_rgb(&s, &small()).unwrap();
        assert_drawn(&buf);
    }

    #[test]
    fn writes_valid_png_and_svg_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let r = result_with_views();
        let png = dir.join("run.png");
        render_file(&r, &small(), &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        // IHDR: width and height, big-endian, at offsets 16 and 20.
        let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
        assert_eq!((w, h), (640, 480));
        assert_eq!(&bytes[12..16], b"IHDR");
        assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND");

        let svg = dir.join("sweep.svg");
        render_file(&result_with_sweep(), &small(), &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.trim_start().starts_with("<svg"), "{}", &text[..80]);
        assert!(text.trim_end().ends_with("</svg>"));
        assert!(
            text.contains("response/request interval (ms)"),
            "axis label"
        );
        assert!(
            text.contains("tcp server (TCP view, the kernel&apos;s RTT samples): p50")
                || text.contains("tcp server (TCP view, the kernel's RTT samples): p50"),
            "legend"
        );
        assert!(text.contains("<polygon"), "percentile band");
        assert_well_nested(&text);
    }

    /// Every element opened is closed in order (a small XML well-nestedness check).
    fn assert_well_nested(text: &str) {
        let mut stack: Vec<String> = Vec::new();
        for chunk in text.split('<').skip(1) {
            let tag = chunk.split('>').next().expect("tag");
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == ':')
                .collect();
            assert!(!name.is_empty(), "bad tag <{tag}>");
            if tag.starts_with('/') {
                assert_eq!(
                    stack.pop().as_deref(),
                    Some(name.as_str()),
                    "mismatched </{name}>"
                );
            } else if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    }

    #[test]
    fn svg_carries_title_settings_labels_and_legend() {
        let s = render_svg_string(&result_with_views(), &small()).unwrap();
        for want in [
            "test run",
            "duration 5s, interval 10ms",
            "RTT over time",
            "CDF of RTT samples",
            "RTT (ms, log scale)",
            "time since start (s)",
            "tcp client (tcp, n=500)",
            "sampler (sampler, n=50)",
        ] {
            assert!(s.contains(want), "missing '{want}'");
        }
    }

    #[test]
    fn cloud_distribution_is_drawn_in_the_cdf() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cloud");
        let c = CloudCdf::from_file(&dir.join("explicit-vm_flow.json")).unwrap();
        assert_eq!(c.points_us.first(), Some(&(0.0, 0.0)));
        assert_eq!(c.points_us.last(), Some(&(8000.0, 1.0)));
        let r = result_with_views();
        let opts = ChartOptions {
            kind: ChartKind::Cdf,
            cloud: Some(c),
            ..small()
        };
        let s = render_svg_string(&r, &opts).unwrap();
        assert!(s.contains("cloud (1002 samples in 1 point,"), "legend");
        assert_drawn(&render_rgb(&r, &opts).unwrap());
        let e = CloudCdf::from_file(&dir.join("aligned-p50.json")).unwrap_err();
        assert!(e.to_string().contains("no distribution point"), "{e}");
    }

    #[test]
    fn time_axis_is_linear_for_similar_rtts() {
        let r = result_with_views();
        let one = ChartOptions {
            kind: ChartKind::Timeseries,
            views: vec!["tcp client".into()],
            ..small()
        };
        let s = render_svg_string(&r, &one).unwrap();
        assert!(s.contains("RTT (ms)") && !s.contains("log scale"));
        assert!(!s.contains("sampler (sampler"), "filtered view drawn");
    }

    #[test]
    fn sweeps_over_decades_get_a_log_axis_and_odd_inputs_still_draw() {
        let mut r = result_with_sweep();
        let sw = r.sweep.as_mut().unwrap();
        for (p, x) in sw
            .points
            .iter_mut()
            .zip([100.0, 300.0, 500.0, 1000.0, 3000.0, 5000.0])
        {
            p.x = x;
        }
        sw.points.truncate(6);
        let s = render_svg_string(&r, &small()).unwrap();
        assert!(s.contains("response/request interval (ms), log scale"));
        assert_drawn(&render_rgb(&r, &small()).unwrap());
        // One sweep point: a bar instead of a band.
        r.sweep.as_mut().unwrap().points.truncate(1);
        assert_drawn(&render_rgb(&r, &small()).unwrap());
        // One sample, and a zero RTT, in the time series and the CDF.
        let mut one = RunResult::new("x", json!({}));
        let mut v = ViewSeries::new("only", ViewKind::Ping);
        v.samples = vec![Sample::at_s(3.0, 0.0), Sample::at_s(3.0, 250.0)];
        one.views.push(v);
        let buf = render_rgb(&one, &small()).unwrap();
        assert!(buf.chunks(3).any(|p| p == [0, 114, 178]));
    }

    #[test]
    fn refuses_what_it_cannot_draw() {
        let r = result_with_views();
        let e = render_rgb(
            &r,
            &ChartOptions {
                kind: ChartKind::Sweep,
                ..small()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("no sweep"), "{e}");
        let e = render_rgb(
            &r,
            &ChartOptions {
                views: vec!["nope".into()],
                ..small()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("no view 'nope'"), "{e}");
        let empty = RunResult::new("x", json!({}));
        assert!(render_rgb(&empty, &small())
            .unwrap_err()
            .to_string()
            .contains("no samples"));
        assert!(ImageFormat::from_path(Path::new("a.jpg")).is_err());
        let e = render_file(&r, &small(), Path::new("/nonexistent-dir/a.png")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

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

    #[test]
    fn subtitles_fit_and_use_the_users_words() {
        let line = "interval_ns=10000000, length_s=3, burst=1, sizes=1/1, sampler.sample_every=1";
        assert_eq!(
            subtitle(line, 200),
            "interval 10ms, length 3s, burst 1, sizes 1/1, sampler.sample every 1"
        );
        let cut = subtitle(line, 40);
        assert!(cut.chars().count() <= 40, "{cut}");
        assert!(
            cut.starts_with("interval 10ms, length 3s") && cut.ends_with("more"),
            "{cut}"
        );
        assert_eq!(subtitle("", 40), "");
        // The legend names what a view measures.
        assert_eq!(
            full_name("rr", Some(ViewKind::Probe)),
            "rr (request/response probe, send() to recv())"
        );
    }

    #[test]
    fn thinning_keeps_extremes() {
        let mut v = ViewSeries::new("x", ViewKind::Probe);
        v.samples = (0..100_000)
            .map(|i| Sample::at_s(i as f64 * 1e-3, if i == 54_321 { 99_000.0 } else { 100.0 }))
            .collect();
        let pts = envelope(&v, 500);
        assert!(pts.len() <= 1000);
        assert!(pts.iter().any(|p| p.1 == 99.0), "the spike survives");
        let c = cdf_points(&v, 2000);
        assert!(c.len() <= 2001);
        assert_eq!(c.last().unwrap().1, 1.0);
    }

    /// The numbers of a result, short, for a failure message.
    fn numbers(r: &RunResult) -> String {
        let mut out = String::new();
        for v in &r.views {
            let s: Vec<String> = v
                .samples
                .iter()
                .map(|s| format!("({:e}, {:e})", s.t_s(), s.rtt_us))
                .collect();
            out += &format!("view '{}' (t_s, rtt_us): {}; ", v.name, s.join(" "));
        }
        if let Some(sw) = &r.sweep {
            for p in &sw.points {
                let st: Vec<String> = p
                    .views
                    .iter()
                    .map(|s| format!("{:?}/{:?}/{:?}", s.p5_us, s.p50_us, s.p95_us))
                    .collect();
                out += &format!("sweep x={:e} p5/p50/p95 {}; ", p.x, st.join(" "));
            }
        }
        out
    }

    /// Render on another thread; fail (printing the input) if it takes longer than `limit`. A hang
    /// leaves that thread spinning, but the test reports instead of blocking the suite.
    fn render_within(
        r: &RunResult,
        opts: &ChartOptions,
        limit: std::time::Duration,
    ) -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (r2, o2) = (r.clone(), opts.clone());
        std::thread::spawn(move || {
            let out = std::panic::catch_unwind(|| render_rgb(&r2, &o2).map(|_| ()));
            let _ = tx.send(out);
        });
        match rx.recv_timeout(limit) {
            // Refusing with an error is fine; a panic or no answer is not.
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(format!(
                "rendering {:?} panicked on {}",
                opts.kind,
                numbers(r)
            )),
            Err(_) => Err(format!(
                "rendering {:?} did not finish within {limit:?} on {}",
                opts.kind,
                numbers(r)
            )),
        }
    }

    fn one_sample(t_s: f64, rtt_us: f64) -> RunResult {
        let mut r = RunResult::new("x", json!({}));
        let mut v = ViewSeries::new("v", ViewKind::Probe);
        v.samples = vec![Sample::at_s(t_s, rtt_us), Sample::at_s(1.0, 250.0)];
        r.views.push(v);
        r
    }

    fn sweep_at(xs: &[f64], p50_us: f64) -> RunResult {
        let mut r = result_with_sweep();
        let sw = r.sweep.as_mut().unwrap();
        sw.points.truncate(xs.len());
        for (p, &x) in sw.points.iter_mut().zip(xs) {
            p.x = x;
            p.views[0].p50_us = Some(p50_us);
        }
        r
    }

    const LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

    /// Issue 18 item 3: the three inputs that looped forever at 100% CPU.
    #[test]
    fn subnormal_and_huge_values_do_not_hang() {
        let kinds = [ChartKind::Timeseries, ChartKind::Cdf, ChartKind::Overview];
        let mut failures = Vec::new();
        // A subnormal RTT, alone and next to an ordinary one.
        let mut alone = one_sample(0.0, 1e-310);
        alone.views[0].samples.truncate(1);
        for r in [one_sample(0.0, 1e-310), alone] {
            for kind in kinds {
                failures.extend(render_within(&r, &ChartOptions { kind, ..small() }, LIMIT).err());
            }
        }
        // Times of +-1e308.
        for t in [1e308, -1e308] {
            for kind in kinds {
                let r = one_sample(t, 100.0);
                failures.extend(render_within(&r, &ChartOptions { kind, ..small() }, LIMIT).err());
            }
        }
        // Sweep x of +-1e308, and a subnormal percentile.
        for r in [
            sweep_at(&[-1e308, 1e308], 500.0),
            sweep_at(&[1e308, 1.0], 500.0),
            sweep_at(&[0.0, 1.0, 2.0], 1e-310),
        ] {
            failures.extend(render_within(&r, &small(), LIMIT).err());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Any f64, with the hostile ones (subnormal, +-huge, NaN, +-inf, -0) much more likely than
    /// `any::<f64>()` alone would make them.
    fn hostile_f64() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![
            3 => any::<f64>(),
            2 => 0.0f64..1e6,
            1 => (1u64..(1 << 52)).prop_map(f64::from_bits),
            1 => Just(1e-310),
            1 => Just(f64::MIN_POSITIVE),
            1 => Just(1e308),
            1 => Just(-1e308),
            1 => Just(f64::MAX),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => Just(-0.0),
            1 => Just(1e12),
            1 => -1e13f64..1e13,
        ]
    }

    fn hostile_result(samples: Vec<Vec<(f64, f64)>>, sweep: Vec<(f64, [f64; 3])>) -> RunResult {
        let mut r = RunResult::new("x", json!({}));
        for (k, s) in samples.into_iter().enumerate() {
            let mut v = ViewSeries::new(format!("v{k}"), ViewKind::Probe);
            v.samples = s
                .into_iter()
                .map(|(t_s, rtt_us)| Sample::at_s(t_s, rtt_us))
                .collect();
            r.views.push(v);
        }
        if !sweep.is_empty() {
            r.sweep = Some(Sweep {
                parameter: "p".into(),
                unit: String::new(),
                points: sweep
                    .into_iter()
                    .map(|(x, [a, b, c])| SweepPoint {
                        x,
                        settings: serde_json::Value::Null,
                        views: vec![ViewSummary {
                            view: "v0".into(),
                            count: 1,
                            p5_us: Some(a),
                            p50_us: Some(b),
                            p95_us: Some(c),
                            ..Default::default()
                        }],
                    })
                    .collect(),
            });
        }
        r
    }

    proptest::proptest! {
        // Bounded: ~64 cases of a handful of small renders each, a few seconds in all.
        #![proptest_config(proptest::test_runner::Config {
            cases: 64,
            max_shrink_iters: 64,
            max_shrink_time: 10_000,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Issue 18 item 3: no combination of floats in a result hangs or panics the renderer,
        /// whether it reaches it directly (library use) or through the result parser (the CLI).
        #[test]
        fn arbitrary_floats_render_in_bounded_time(
            samples in proptest::collection::vec(
                proptest::collection::vec((hostile_f64(), hostile_f64()), 0..6), 1..3),
            sweep in proptest::collection::vec((hostile_f64(), [hostile_f64(), hostile_f64(), hostile_f64()]), 0..4),
        ) {
            let r = hostile_result(samples, sweep);
            let tiny = ChartOptions { size: (320, 240), ..Default::default() };
            let kinds = [ChartKind::Overview, ChartKind::Sweep];
            for kind in kinds {
                let opts = ChartOptions { kind, ..tiny.clone() };
                if let Err(e) = render_within(&r, &opts, LIMIT) {
                    proptest::prop_assert!(false, "{}", e);
                }
            }
            // Through the parser: what it accepts must render too, and what it accepts is in range.
            let text = serde_json::to_string(&r).unwrap();
            if let Ok(back) = RunResult::from_json(&text, "hostile.json") {
                for v in &back.views {
                    for s in &v.samples {
                        proptest::prop_assert!(s.t_s().abs() <= 1e12 && (0.0..=1e12).contains(&s.rtt_us), "{:?}", s);
                    }
                }
                let opts = ChartOptions { kind: ChartKind::Auto, ..tiny.clone() };
                if let Err(e) = render_within(&back, &opts, LIMIT) {
                    proptest::prop_assert!(false, "after parsing: {}", e);
                }
            }
        }
    }
}
