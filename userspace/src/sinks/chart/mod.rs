//! `rttscope chart`: draw a saved result (no privileges needed) to PNG or SVG.
//!
//! Kinds: `timeseries` (RTT over time, one series per view), `cdf` (fraction of samples at or
//! below an RTT, log RTT axis), `overview` (time series above CDF), `sweep` (RTT on a log axis
//! against the swept parameter: p50 line and p5-p95 band per view, like the ACM Queue figure).
//! `auto` picks `sweep` when the result has a sweep, `overview` otherwise.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (`userspace/assets/`, Bitstream Vera
//! license), so rendering needs no system font libraries.
//!
//! - [`timeseries`], [`cdf`], [`sweep`]: the three charts (an overview is the first two).
//! - [`axes`]: values as drawn and the axes' ranges; [`style`]: colours, font, legend;
//!   [`text`]: labels and the settings line.
use std::path::Path;
use std::sync::Once;

use anyhow::{anyhow, bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::analysis::results::{RunResult, ViewSeries};

mod axes;
mod cdf;
mod style;
mod sweep;
mod text;
mod timeseries;

use axes::points;
use cdf::cdf;
pub use cdf::CloudCdf;
use style::{derr, font};
use sweep::sweep;
pub use sweep::MIN_BAND_SAMPLES;
use text::{short, subtitle, subtitle_chars};
use timeseries::timeseries;

static FONT: &[u8] = include_bytes!("../../../assets/DejaVuSans.ttf");
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
        ChartKind::Sweep => sweep(&body, result, &opts.views),
        ChartKind::Auto => unreachable!("plan resolves auto"),
    }
}

#[cfg(test)]
mod tests {
    use super::cdf::cdf_points;
    use super::timeseries::envelope;
    use super::*;
    use crate::analysis::results::{Sample, Sweep, SweepPoint, ViewKind, ViewSummary};
    use crate::analysis::view_kind::ViewKind as PassiveKind;
    use serde_json::json;

    fn result_with_views() -> RunResult {
        let mut r = RunResult::new("compare", json!({"interval": "10ms", "duration": "5s"}));
        r.title = Some("test run".into());
        let mut tcp = ViewSeries::new("tcp client", ViewKind::Passive(PassiveKind::Tcp));
        tcp.samples = (0..500)
            .map(|i| Sample::at_s(i as f64 * 0.01, 120.0 + (i % 17) as f64 * 5.0))
            .collect();
        let mut sampler = ViewSeries::new("sampler", ViewKind::Passive(PassiveKind::Sampler));
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
                            kind: Some(ViewKind::Passive(PassiveKind::Tcp)),
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
