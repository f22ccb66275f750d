//! The lab's summary table (summary.csv, SUMMARY.md and the terminal): a row per phase, the
//! request/response columns, then every other view that saw samples (the lab's views,
//! [`lab_views`]: the passive ones and their headers from the registry).
use std::time::Duration;

use super::phase::{lab_views, LabView, Source};
use crate::analysis::results::ViewSummary;
use crate::lab::scenarios::{Plan, Scenario, Workload};
use crate::sinks::table::{Align, Table};

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The swept value of a phase as a number (labels that are not numbers: their index).
pub(super) fn x_of(plan: &Plan, i: usize) -> f64 {
    let ph = &plan.phases[i];
    if let Ok(x) = ph.label.parse::<f64>() {
        return x;
    }
    match (&ph.workload, ph.down.queue_limit) {
        // bufferbloat: the queue in KiB with a bulk flow, 0 for the idle phase
        (Workload::BulkWithProbes { .. }, Some(q)) => q as f64 / 1024.0,
        _ if plan.scenario == Scenario::Bufferbloat => 0.0,
        (Workload::PingAndRr { interval }, _) => ms(*interval),
        _ => i as f64,
    }
}

pub(super) fn fmt_ms(us: Option<f64>) -> String {
    match us {
        None => "-".into(),
        Some(x) if !x.is_finite() => "-".into(),
        Some(x) => {
            let m = x / 1e3;
            if m < 10.0 {
                format!("{m:.3}")
            } else if m < 1000.0 {
                format!("{m:.1}")
            } else {
                format!("{m:.0}")
            }
        }
    }
}

/// The unit of the swept parameter, in the table, the CSV and the chart's axis.
pub(super) fn swept_unit(plan: &Plan) -> &'static str {
    match plan.scenario {
        Scenario::Loss => "%",
        Scenario::Bufferbloat => "KiB queue, 0 = idle",
        Scenario::RttStep => "s",
        _ => "ms",
    }
}

pub(super) fn build_table(plan: &Plan, points: &[Vec<ViewSummary>], with_p95: bool) -> Table {
    let has = |name: &str| {
        points
            .iter()
            .any(|p| p.iter().any(|v| v.view == name && v.count > 0))
    };
    // every view but the request/response probe's (its own columns first) that saw samples
    let others: Vec<LabView> = lab_views()
        .into_iter()
        .filter(|v| v.source != Source::Rr && has(&v.name))
        .collect();
    let head = table_head(plan, &others, with_p95);
    let mut rows = Vec::new();
    for (i, p) in points.iter().enumerate() {
        rows.push(table_row(&plan.phases[i].label, p, &others, with_p95));
    }
    let mut t = head
        .into_iter()
        .fold(Table::new(), |t, h| t.col(h, Align::Right));
    for r in rows {
        t.row(r);
    }
    t
}

/// The table's headers: the swept value, the RR columns, then the other
/// views that saw samples (`others`), then the cloud metric's medians of those read as it.
fn table_head(plan: &Plan, others: &[LabView], with_p95: bool) -> Vec<String> {
    let mut head = vec![
        format!(
            "{} ({})",
            plan.swept.split(" (").next().unwrap_or("phase"),
            swept_unit(plan)
        ),
        "RR_N".into(),
        "RR_MIN".into(),
        "RR_MEAN".into(),
        "RR_P50".into(),
        "RR_P90".into(),
    ];
    if with_p95 {
        head.push("RR_P95".into());
    }
    head.push("RR_P99".into());
    for v in others {
        head.push(format!("{}_P50", v.short));
        if with_p95 {
            head.push(format!("{}_P95", v.short));
        }
    }
    for v in others.iter().filter(|v| v.cloud()) {
        head.push(format!("{}_CLOUD_P50", v.short));
    }
    // Units in the headers: every column but the swept value and the count is ms.
    for h in head.iter_mut().skip(1).filter(|h| !h.ends_with("_N")) {
        h.push_str(" ms");
    }
    head
}

/// One phase's row (`p`: its views' summaries), in [`table_head`]'s order.
fn table_row(label: &str, p: &[ViewSummary], others: &[LabView], with_p95: bool) -> Vec<String> {
    let get = |name: &str| {
        p.iter()
            .find(|v| v.view == name)
            .cloned()
            .unwrap_or_default()
    };
    let rr = get("rr");
    let mut r = vec![
        label.to_string(),
        rr.count.to_string(),
        fmt_ms(rr.min_us),
        fmt_ms(rr.mean_us),
        fmt_ms(rr.p50_us),
        fmt_ms(rr.extra.get("p90_us").copied()),
    ];
    if with_p95 {
        r.push(fmt_ms(rr.p95_us));
    }
    r.push(fmt_ms(rr.p99_us));
    for v in others {
        let v = get(&v.name);
        r.push(fmt_ms(v.p50_us));
        if with_p95 {
            r.push(fmt_ms(v.p95_us));
        }
    }
    for v in others.iter().filter(|v| v.cloud()) {
        r.push(fmt_ms(get(&v.name).extra.get("cloud_p50_us").copied()));
    }
    r
}
