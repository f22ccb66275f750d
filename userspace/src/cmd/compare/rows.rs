//! The table's rows and the result: one row (and one view in the result) per passive view and
//! probe, the sampler's samples through the cloud buckets, and `--cloud FILE`'s row.
use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use super::select::{Series, Sides};
use super::window::{IrttOutcome, RrResults};
use crate::active::rr::Kind;
use crate::analysis::dist::{BucketOptions, Distribution, ValueUnit};
use crate::analysis::flow::Side;
use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries};
use crate::analysis::stats::Summary;
use crate::session::Session;

/// One row of the comparison table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub view: String,
    pub what: String,
    pub summary: Summary,
    /// Set for rows whose percentiles come from a bucketed distribution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucketed: Option<String>,
}

pub(super) fn summary_of(s: &[(f64, f64)]) -> Summary {
    let v: Vec<f64> = s.iter().map(|x| x.1).collect();
    Summary::from_us(&v)
}

/// The result being assembled and the table's rows, one per view, in order.
pub(super) struct Report {
    pub(super) result: RunResult,
    pub(super) rows: Vec<Row>,
}

impl Report {
    /// One view's samples into the result and its row into the table.
    fn add_series(
        &mut self,
        name: &str,
        kind: ViewKind,
        side: Option<&str>,
        what: String,
        s: &[(f64, f64)],
        settings: serde_json::Value,
    ) {
        let mut v = ViewSeries::new(name, kind);
        v.side = side.map(str::to_string);
        v.settings = settings;
        v.samples = s.iter().map(|&(t, r)| Sample::at_s(t, r)).collect();
        v.summary = Some(crate::analysis::results::ViewSummary::of_samples(
            name,
            Some(kind),
            &v.rtts_us(),
        ));
        self.result.views.push(v);
        self.rows.push(Row {
            view: name.to_string(),
            what,
            summary: summary_of(s),
            bucketed: None,
        });
    }

    /// The passive views' rows: each view's series as it declares them (TCP client/server,
    /// sampler client/server/icmp), then the samples of each view a cloud flow metric buckets
    /// through the cloud buckets (whose median is returned as evidence for `--explain`).
    pub(super) fn add_passive(
        &mut self,
        layout: &BucketOptions,
        session: &Session,
        sides: &Sides,
    ) -> Option<CloudEvidence> {
        let mut evidence = None;
        for v in session.attached() {
            let kind = ViewKind::Passive(v.kind);
            for (i, s) in v.series.iter().cloned().enumerate() {
                let samples = sides.of(v.kind, s.side);
                if i > 0 && samples.is_empty() {
                    continue;
                }
                self.add_series(
                    &format!("{} {}", v.kind.as_str(), s.label),
                    kind,
                    Some(s.side.as_str()),
                    s.what,
                    samples,
                    s.settings,
                );
            }
            if v.kind.cloud_metric() {
                let all: Series = [Side::Client, Side::Server]
                    .iter()
                    .flat_map(|&side| sides.of(v.kind, side).iter().copied())
                    .collect();
                let (row, e) = cloud_row(v.kind.as_str(), layout, &all);
                self.rows.push(row);
                evidence = evidence.or(e);
            }
        }
        evidence
    }

    /// The probes' rows, in the order they ran; the first failed probe's
    /// error ends the command.
    pub(super) fn add_probes(
        &mut self,
        rr_results: RrResults,
        irtt_result: IrttOutcome,
        irtt_cfg: Option<&crate::active::irtt::IrttConfig>,
        origin_mono: u64,
    ) -> Result<()> {
        for r in rr_results {
            let r = r?;
            let name = crate::active::output::view_name(r.settings.kind);
            // On the rows' clock: from the TCP probe's first transaction.
            let shift = r.ident.start_mono_ns as f64 - origin_mono as f64;
            let s: Series = r
                .samples
                .iter()
                .map(|&(off, rtt)| ((off as f64 + shift) / 1e9, rtt as f64 / 1e3))
                .collect();
            let kind = if r.settings.kind == Kind::Icmp {
                ViewKind::Ping
            } else {
                ViewKind::Probe
            };
            let timed = match r.settings.kind {
                Kind::TcpConnect => "handshakes, the kernel's SYN to SYN-ACK (tcpi_rtt)",
                _ => "send()->recv() of the response",
            };
            let what = format!(
                "{} {timed}; {} lost{}",
                r.settings.kind.label(),
                r.counts.lost,
                if r.counts.errors > 0 {
                    format!(", {}", crate::sinks::table::count(r.counts.errors, "error"))
                } else {
                    String::new()
                }
            );
            let settings = serde_json::to_value(&r.settings)?;
            self.add_series(name, kind, None, what, &s, settings);
        }
        if let Some(ir) = irtt_result {
            let ir = ir?;
            let s: Series = ir
                .rtt_samples()
                .map(|(off, rtt)| (off as f64 / 1e9, rtt as f64 / 1e3))
                .collect();
            self.add_series(
                "irtt",
                ViewKind::Irtt,
                None,
                "irtt isochronous UDP (irtt protocol)".into(),
                &s,
                json!({"interval_s": irtt_cfg.map(|c| c.interval.as_secs_f64())}),
            );
        }
        Ok(())
    }
}

/// `--cloud FILE`: the Cloud Monitoring file, parsed.
pub(super) fn read_cloud_file(
    path: &std::path::Path,
) -> Result<(String, crate::analysis::cloud_monitoring::CloudFile)> {
    let name = path.display().to_string();
    let text = crate::sys::files::read_to_string(path)?;
    Ok((
        name.clone(),
        crate::analysis::cloud_monitoring::parse(&text, &name)?,
    ))
}

/// The "cloud" row of `--cloud FILE`: the file's distribution points merged, percentiles by the
/// aligner's interpolation in the file's own buckets; or the already-aligned values.
pub(super) fn cloud_file_row(name: &str, f: &crate::analysis::cloud_monitoring::CloudFile) -> Row {
    let m = crate::analysis::cloud_monitoring::merge_file(f);
    let mut sm = Summary::empty();
    let (what, bucketed) = match &m.distribution {
        Some(d) => {
            let pct = |p: f64| {
                d.percentile(p)
                    .ok()
                    .flatten()
                    .map_or(f64::NAN, |x| d.unit.to_us(x.value))
            };
            sm.n = d.count;
            sm.p50 = pct(50.0);
            sm.p90 = pct(90.0);
            sm.p99 = pct(99.0);
            sm.mean = d.unit.to_us(d.mean);
            (
                format!(
                    "the cloud's distribution from {name}: {} point(s){}, layout from the file ({}), percentile aligner interpolation",
                    m.points,
                    if m.skipped > 0 {
                        format!(" ({} with another layout left out)", m.skipped)
                    } else {
                        String::new()
                    },
                    d.bucket_options.spec()
                ),
                Some(d.bucket_options.spec()),
            )
        }
        None => {
            sm.n = m.aligned.len() as u64;
            let ms: Vec<f64> = m.aligned.iter().map(|v| v * 1000.0).collect();
            let s = Summary::from_us(&ms);
            sm.min = s.min;
            sm.mean = s.mean;
            sm.max = s.max;
            (
                format!(
                    "{name}: {} already-aligned value(s) (the request's aligner, e.g. ALIGN_PERCENTILE_50; ms assumed): min/mean/max of them, N counts points",
                    m.aligned.len()
                ),
                None,
            )
        }
    };
    Row {
        view: "cloud".into(),
        what,
        summary: sm,
        bucketed,
    }
}

impl Report {
    /// `--cloud FILE`: one more row, and the file's distribution in the result's settings.
    pub(super) fn add_cloud_file(
        &mut self,
        name: &str,
        f: &crate::analysis::cloud_monitoring::CloudFile,
    ) {
        self.rows.push(cloud_file_row(name, f));
        self.result.settings["cloud_file"] = json!({
            "path": name,
            "merged": crate::analysis::cloud_monitoring::merge_file(f),
        });
    }
}

/// A view's cloud row (`sampler cloud`): its samples through the cloud metric's buckets
/// (percentiles interpolated inside buckets, min/max not defined), and where its median came
/// from.
pub(super) fn cloud_row(
    view: &str,
    layout: &BucketOptions,
    all: &Series,
) -> (Row, Option<CloudEvidence>) {
    let mut d = Distribution::new(layout.clone(), ValueUnit::Ms);
    for (_, r) in all {
        d.add_us(*r);
    }
    let pct = |p: f64| d.percentile(p).ok().flatten();
    let to_us = |p: Option<crate::analysis::dist::Percentile>| {
        p.map(|x| ValueUnit::Ms.to_us(x.value)).unwrap_or(f64::NAN)
    };
    let mut sm = Summary::empty();
    sm.n = d.count;
    sm.p50 = to_us(pct(50.0));
    sm.p90 = to_us(pct(90.0));
    sm.p99 = to_us(pct(99.0));
    sm.mean = if d.count > 0 {
        ValueUnit::Ms.to_us(d.mean)
    } else {
        f64::NAN
    };
    let evidence = pct(50.0).map(|p| CloudEvidence {
        p50_us: ValueUnit::Ms.to_us(p.value),
        bucket_lo_ms: layout.lower(p.bucket),
        bucket_hi_ms: layout.upper(p.bucket),
        bucket_share_pct: p.p_up - p.p_low,
        exact_p50_us: summary_of(all).p50,
    });
    let row = Row {
        view: format!("{view} cloud"),
        what: format!(
            "{view} samples through cloud buckets ({}), percentile aligner interpolation",
            layout.spec()
        ),
        summary: sm,
        bucketed: Some(layout.spec()),
    };
    (row, evidence)
}

/// Where the cloud-bucket median came from.
#[derive(Debug, Clone, Copy)]
pub struct CloudEvidence {
    pub p50_us: f64,
    pub bucket_lo_ms: f64,
    pub bucket_hi_ms: f64,
    /// Share of the samples in that bucket, percent.
    pub bucket_share_pct: f64,
    pub exact_p50_us: f64,
}
