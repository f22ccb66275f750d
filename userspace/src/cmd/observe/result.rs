//! `observe --json FILE`: the whole run as one result document (docs/results.md).
//!
//! Per view and side (`tcp client`, `tcp server`, `sampler client`, ...), a series holding that
//! side's whole-run summary and, with `--raw`, every raw sample; per flow and side, a series
//! holding the flow's summary and details (namespace, state, srtt, retransmissions). The run's
//! settings, the attached hooks and every counter go with it. Raw samples are collected here as
//! the output code reads them (observe runs on one thread).
use std::cell::RefCell;
use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::json;

use super::args::ObserveArgs;
use crate::analysis::flow::{Flow, Side};
use crate::analysis::results::{RunResult, Sample, ViewKind, ViewSeries, ViewSummary};
use crate::analysis::stats::Summary;
use crate::session::{FlowRow, RawEvent, RawSample, Session, ViewStats};

/// Most raw samples kept in memory for the document; later ones are counted, not kept.
pub const MAX_SAMPLES: usize = 5_000_000;

/// How the summaries of this document are computed.
const METHOD: &str = "log-linear histogram: 1 us buckets below 128 us, then <= 1.6% wide; percentiles within 0.8% of the exact ones";

/// One raw sample waiting for the end: which flow and side, when, how long.
struct Raw {
    view: ViewKind,
    flow: Flow,
    side: Option<Side>,
    sample: Sample,
}

#[derive(Default)]
struct Collector {
    doc: Option<RunResult>,
    raw: Vec<Raw>,
    not_kept: u64,
    /// `--json -`: the real standard output, kept for the document while fd 1 points at stderr.
    stdout: Option<std::fs::File>,
}

thread_local! {
    static DOC: RefCell<Collector> = RefCell::new(Collector::default());
}

/// With `--json FILE`: start the document (settings, hooks, start time) and collect raw samples.
pub(super) fn start(args: &ObserveArgs, session: &Session, settings: serde_json::Value) {
    if args.json.is_none() {
        return;
    }
    let mut doc = RunResult::new("observe", settings);
    doc.title = Some("rttscope observe".into());
    // every registered view's settings and attachments (null: not attached)
    doc.settings["hooks"] = crate::views::ViewKind::ALL
        .iter()
        .map(|k| {
            let a = session.attached().iter().find(|a| a.kind == *k);
            let v = a.map(|a| a.settings.clone());
            (k.as_str().to_string(), v.unwrap_or_default())
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    // `--json -`: the document alone on standard output; everything observe prints (table, JSON
    // Lines, the end line) goes to stderr instead, by pointing fd 1 at stderr until the end.
    let stdout = path_is_stdout(args)
        .then(crate::analysis::results::stdout_for_document)
        .and_then(Result::ok);
    DOC.with(|d| {
        *d.borrow_mut() = Collector {
            doc: Some(doc),
            stdout,
            ..Default::default()
        }
    });
}

fn path_is_stdout(args: &ObserveArgs) -> bool {
    args.json.as_deref() == Some(std::path::Path::new("-"))
}

fn push(view: ViewKind, flow: Flow, side: Option<Side>, ts_ns: u64, start_mono: u64, rtt_us: u32) {
    DOC.with(|d| {
        let mut d = d.borrow_mut();
        if d.doc.is_none() {
            return;
        }
        if d.raw.len() >= MAX_SAMPLES {
            d.not_kept += 1;
            return;
        }
        let t_us = (ts_ns as i64 - start_mono as i64) as f64 / 1e3;
        d.raw.push(Raw {
            view,
            flow,
            side,
            sample: Sample {
                t_us,
                rtt_us: rtt_us as f64,
            },
        });
    });
}

/// Raw samples of every view (flow ends are not samples). A sample of a view whose samples carry
/// their side (the registry's `sample_side`: TCP's) keeps it; the others' (the sampler's) side
/// comes from its flow's row at the end.
pub(super) fn record_raw(samples: &[RawSample], start_mono: u64) {
    for s in samples.iter().filter(|s| s.event == RawEvent::Rtt) {
        let view = ViewKind::Passive(s.view);
        let side = s.view.info().sample_side.then_some(s.side);
        push(view, s.flow, side, s.ts_ns, start_mono, s.rtt_us);
    }
}

fn side_name(s: Side) -> &'static str {
    match s {
        Side::Unknown => "unknown",
        s => s.as_str(),
    }
}

fn summary(view: &str, kind: ViewKind, h: &Summary) -> ViewSummary {
    let v = |x: f64| (h.n > 0 && !x.is_nan()).then_some(x);
    ViewSummary {
        view: view.to_string(),
        kind: Some(kind),
        count: h.n,
        min_us: v(h.min),
        mean_us: v(h.mean),
        p50_us: v(h.p50),
        p90_us: v(h.p90),
        p99_us: v(h.p99),
        max_us: v(h.max),
        method: Some(METHOD.into()),
        ..Default::default()
    }
}

/// The series of one flow's row in one view: its summary and details, no samples.
fn flow_series(r: &FlowRow, kind: ViewKind, st: &ViewStats) -> ViewSeries {
    let side = side_name(r.side);
    let flow = format!("{} -> {}", r.local, r.remote);
    let name = format!("{} {side} {flow} netns {}", kind.as_str(), r.netns);
    let mut v = ViewSeries::new(name.clone(), kind);
    v.side = Some(side.into());
    v.flow = Some(flow);
    v.summary = Some(summary(&name, kind, &st.summary));
    v.details = json!({
        "netns": r.netns, "netns_name": r.netns_name, "origin": r.origin, "state": r.state,
        "closed": r.closed, "srtt_us": st.srtt_us, "retrans": st.retrans,
    });
    if let Some(us) = st.handshake_us {
        v.details["handshake_us"] = json!(us);
    }
    if let Some(w) = &r.workload {
        v.details["workload"] = json!(w.as_ref());
    }
    v
}

/// The side of a raw sample: its own when the event says, else its flow's row's (the sampler's
/// events and TCP events of flows the kernel could not place carry none).
fn raw_side(r: &Raw, rows: &[FlowRow]) -> &'static str {
    if let Some(s @ (Side::Client | Side::Server)) = r.side {
        return side_name(s);
    }
    rows.iter()
        .find(|row| {
            crate::views::ViewKind::from_name(r.view.as_str()).is_some_and(|k| row.views.has(k))
                && row.netns == r.flow.netns
                && row.local == r.flow.local.to_string()
                && row.remote == r.flow.remote.to_string()
        })
        .map_or("unknown", |row| side_name(row.side))
}

/// Per view and side: the whole-run summary and every raw sample of that side.
fn side_series(
    summary_: &crate::session::WholeRun,
    raw: Vec<Raw>,
    not_kept: u64,
) -> Vec<ViewSeries> {
    let mut out: BTreeMap<(&'static str, &'static str), ViewSeries> = BTreeMap::new();
    for (view, sides) in &summary_.totals {
        let kind = ViewKind::from_name(view);
        for (side, h) in sides.iter().filter(|(_, h)| h.count() > 0) {
            let name = format!("{view} {}", side_name(*side));
            let mut v = ViewSeries::new(name.clone(), kind);
            v.side = Some(side_name(*side).into());
            v.summary = Some(summary(&name, kind, &h.summary()));
            out.insert((view, side_name(*side)), v);
        }
    }
    for r in raw {
        let side = raw_side(&r, &summary_.rows);
        let view = r.view.as_str();
        let v = out.entry((view, side)).or_insert_with(|| {
            let mut v = ViewSeries::new(format!("{view} {side}"), r.view);
            v.side = Some(side.into());
            v
        });
        v.samples.push(r.sample);
    }
    let mut v: Vec<ViewSeries> = out.into_values().collect();
    v.extend(handshake_series(&summary_.handshakes));
    if not_kept > 0 {
        for s in &mut v {
            s.dropped.insert("raw_samples_not_kept".into(), not_kept);
        }
    }
    v
}

/// Per view and side: the whole run's handshake RTTs (`tcp handshake client`, ...), summary only.
fn handshake_series(
    hs: &BTreeMap<crate::views::ViewKind, crate::views::view::SideTotals>,
) -> Vec<ViewSeries> {
    let mut out = Vec::new();
    for (view, sides) in hs {
        let kind = ViewKind::Passive(*view);
        for (side, h) in sides.iter().filter(|(_, h)| h.count() > 0) {
            let name = format!("{} handshake {}", view.as_str(), side_name(*side));
            let mut v = ViewSeries::new(name.clone(), kind);
            v.side = Some(side_name(*side).into());
            v.summary = Some(summary(&name, kind, &h.summary()));
            v.details = json!({
                "series": "handshake",
                "what": "each connection's handshake RTT: client SYN -> SYN-ACK, server SYN-ACK -> ACK",
            });
            out.push(v);
        }
    }
    out
}

/// At the end: the document with every side and flow, written to `--json FILE`.
pub(super) fn finish(
    args: &ObserveArgs,
    summary_: &crate::session::WholeRun,
    elapsed_s: f64,
) -> Result<()> {
    let Some(path) = &args.json else {
        return Ok(());
    };
    let (doc, raw, not_kept, stdout) = DOC.with(|d| {
        let mut d = d.borrow_mut();
        (
            d.doc.take(),
            std::mem::take(&mut d.raw),
            d.not_kept,
            d.stdout.take(),
        )
    });
    let Some(mut doc) = doc else {
        return Ok(());
    };
    doc.settings["elapsed_s"] = json!(elapsed_s);
    doc.views = side_series(summary_, raw, not_kept);
    for r in &summary_.rows {
        for (kind, st) in r.views.iter() {
            doc.views.push(flow_series(r, ViewKind::Passive(kind), st));
        }
    }
    dedup_names(&mut doc.views);
    doc.hooks = summary_.hooks.clone();
    doc.counters = summary_
        .counters
        .iter()
        .map(|(k, m)| {
            (
                k.to_string(),
                m.iter().map(|(a, b)| (a.to_string(), *b)).collect(),
            )
        })
        .collect();
    match stdout {
        Some(mut f) => {
            use std::io::Write;
            f.write_all(doc.to_json()?.as_bytes())?;
            f.flush()?;
        }
        None => doc.write_to(path)?,
    }
    Ok(())
}

/// Names are unique within a document: a repeated one gets ` #2`, ` #3`, ...
fn dedup_names(views: &mut [ViewSeries]) {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for v in views {
        let n = seen.entry(v.name.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            v.name = format!("{} #{n}", v.name);
            if let Some(s) = &mut v.summary {
                s.view = v.name.clone();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::hist::Hist;
    use crate::analysis::view_kind::ViewKind as PassiveKind;

    const TCP: ViewKind = ViewKind::Passive(PassiveKind::Tcp);
    const SAMPLER: ViewKind = ViewKind::Passive(PassiveKind::Sampler);

    fn row(side: Side, tcp: bool) -> FlowRow {
        FlowRow {
            tunnel: None,
            netns: 7,
            netns_name: "a".into(),
            local: "10.0.0.1:40000".into(),
            remote: "10.0.0.2:5001".into(),
            side,
            proto: None,
            origin: None,
            state: None,
            closed: false,
            views: crate::analysis::columns::Columns::default().with(
                if tcp {
                    crate::views::ViewKind::Tcp
                } else {
                    crate::views::ViewKind::Sampler
                },
                ViewStats::from_hist(&Hist::default()),
            ),
            workload: None,
            nat: None,
            remote_name: None,
            flow: None,
        }
    }

    fn raw(view: ViewKind, side: Option<Side>, rtt_us: f64) -> Raw {
        Raw {
            view,
            flow: Flow {
                tunnel: Default::default(),
                netns: 7,
                local: "10.0.0.1:40000".parse().unwrap(),
                remote: "10.0.0.2:5001".parse().unwrap(),
            },
            side,
            sample: Sample { t_us: 1.0, rtt_us },
        }
    }

    /// Raw samples land on their side: their own when the event says, else their flow's row's
    /// in the same view; the side totals keep the histogram's summary; drops are counted.
    #[test]
    fn raw_samples_go_to_their_side() {
        let rows = vec![row(Side::Client, true), row(Side::Server, false)];
        assert_eq!(
            raw_side(&raw(TCP, Some(Side::Server), 1.0), &rows),
            "server"
        );
        assert_eq!(
            raw_side(&raw(TCP, Some(Side::Unknown), 1.0), &rows),
            "client"
        );
        assert_eq!(raw_side(&raw(SAMPLER, None, 1.0), &rows), "server");
        assert_eq!(raw_side(&raw(SAMPLER, None, 1.0), &[]), "unknown");
        let mut h = Hist::default();
        for us in [100, 200, 300] {
            h.record(us);
        }
        let mut tcp = crate::session::SideTotals::new();
        tcp.insert(Side::Client, h);
        let summary = crate::session::WholeRun {
            flows: vec![],
            rows,
            totals: [("tcp", tcp)].into_iter().collect(),
            counters: Default::default(),
            hooks: vec![],
            handshakes: Default::default(),
        };
        let v = side_series(
            &summary,
            vec![raw(TCP, None, 150.0), raw(SAMPLER, None, 90.0)],
            4,
        );
        let names: Vec<&str> = v.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["sampler server", "tcp client"]);
        let tcp = &v[1];
        assert_eq!(tcp.summary.as_ref().unwrap().count, 3);
        assert_eq!(
            tcp.samples,
            vec![Sample {
                t_us: 1.0,
                rtt_us: 150.0
            }]
        );
        assert_eq!(tcp.dropped["raw_samples_not_kept"], 4);
    }

    #[test]
    fn repeated_names_are_numbered() {
        let mut v = vec![
            ViewSeries::new("x", TCP),
            ViewSeries::new("x", TCP),
            ViewSeries::new("y", TCP),
        ];
        dedup_names(&mut v);
        let names: Vec<&str> = v.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["x", "x #2", "y"]);
    }
}
