//! The lab's report: result.json (settings, a sweep point per phase, the samples), summary.csv,
//! the charts and SUMMARY.md, and what the terminal shows of them.
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::ValueEnum;
use serde_json::{json, Value};

use super::observations::observations;
use super::phase::{lab_views, left_out_total, view_summary, views_of, PhaseData};
use super::table::{build_table, ms, swept_unit, x_of};
use super::PORT;
use crate::analysis::records;
use crate::analysis::results::{RunResult, Sample, Sweep, SweepPoint, ViewSeries, ViewSummary};
use crate::cmd::lab::observer::lab_kinds;
use crate::lab::scenarios::{PhaseRecord, Plan, Scenario};
use crate::lab::testbed::HOST_IF;
use crate::sinks::table::Table;

/// What the report reads of the run: its phases and the observer's options, start record and
/// counters (the lab environment's, after its last phase).
pub(super) struct RunInfo<'a> {
    pub(super) data: &'a [PhaseData],
    pub(super) run_start_unix: Option<f64>,
    /// `--json FILE`: where the result document goes besides OUT/result.json.
    pub(super) json: Option<&'a Path>,
    pub(super) sample_every: u32,
    pub(super) obs_args: &'a Option<Vec<String>>,
    pub(super) obs_start_line: &'a Option<records::Start>,
    pub(super) obs_counters: &'a Option<records::Counters>,
    /// Raw records no view could decode and samples not of the lab's port.
    pub(super) obs_bad: (u64, u64),
}

/// `--json FILE`: the document again, at FILE or on standard output (`-`, the rest of what lab
/// prints then goes to stderr).
fn write_json_copy(run: &RunInfo, rr: &RunResult) -> Result<()> {
    match run.json {
        None => Ok(()),
        Some(p) if p.as_os_str() == "-" => {
            let mut f = crate::analysis::results::stdout_for_document()?;
            std::io::Write::write_all(&mut f, rr.to_json()?.as_bytes())?;
            Ok(())
        }
        Some(p) => rr.save(p).map_err(|e| anyhow!("{e}")),
    }
}

/// The lab's report in `out`: result.json (and its `--json` copy), summary.csv, the charts and
/// SUMMARY.md, then the table, the observations and the charts' paths on the terminal. Returns
/// the files written, in that order.
pub(super) fn write_report(
    run: &RunInfo,
    plan: &Plan,
    records: &[PhaseRecord],
    out: &Path,
) -> Result<Vec<PathBuf>> {
    let name = plan
        .scenario
        .to_possible_value()
        .unwrap()
        .get_name()
        .to_string();
    let data = run.data;
    let t0 = run.run_start_unix.unwrap_or(0.0);
    let points = phase_points(data);
    let sweep_kind = plan.phases.len() > 1;
    let rr = run_result(run, plan, records, &name, &points, t0, sweep_kind);
    let mut files = vec![save_result(run, &rr, out)?];
    let table = build_table(
        plan,
        &points,
        matches!(plan.scenario, Scenario::Loss | Scenario::Bufferbloat),
    );
    files.push(write_out(out, "summary.csv", table.csv().as_bytes())?);
    let charts = draw_charts(&rr, plan, sweep_kind, out);
    let obs = observations(plan, &points, data);
    let md = summary_markdown(run, plan, &name, t0, &table, &obs, &charts);
    files.push(write_out(out, "SUMMARY.md", md.as_bytes())?);
    println!("{}", table.render());
    for o in &obs {
        println!("{o}");
    }
    for c in &charts {
        println!("chart: {}", c.display());
    }
    files.extend(charts);
    Ok(files)
}

/// The result document of the run `name` started at `t0` (Unix seconds): its settings, title,
/// the sweep (`sweep_kind`: the plan has more than one phase) and each view's sample series.
fn run_result(
    run: &RunInfo,
    plan: &Plan,
    records: &[PhaseRecord],
    name: &str,
    points: &[Vec<ViewSummary>],
    t0: f64,
    sweep_kind: bool,
) -> RunResult {
    let settings = report_settings(run, plan, records, name);
    let mut rr = RunResult::new(format!("lab {name}"), settings);
    rr.title = Some(format!(
        "lab {name}{}",
        if plan.quick { " (quick)" } else { "" }
    ));
    rr.start_unix_s = Some(t0);
    if sweep_kind {
        rr.sweep = Some(sweep_of(plan, points, run.data));
    }
    push_sample_series(&mut rr, run.data, t0);
    rr
}

/// OUT/result.json, then its `--json` copy; returns the path of the first.
fn save_result(run: &RunInfo, rr: &RunResult, out: &Path) -> Result<PathBuf> {
    let p = out.join("result.json");
    rr.save(&p).map_err(|e| anyhow!("{e}"))?;
    write_json_copy(run, rr)?;
    Ok(p)
}

/// `bytes` written to the file `name` in `out` (atomically); returns its path.
fn write_out(out: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let p = out.join(name);
    crate::sys::files::write_atomically(&p, bytes)
        .with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// Each phase's summary of every view.
fn phase_points(data: &[PhaseData]) -> Vec<Vec<ViewSummary>> {
    data.iter()
        .map(|d| {
            views_of(d)
                .into_iter()
                .map(|(v, s)| view_summary(&v.name, v.kind, s))
                .collect()
        })
        .collect()
}

/// The run's settings as result.json records them.
fn report_settings(run: &RunInfo, plan: &Plan, records: &[PhaseRecord], name: &str) -> Value {
    // each passive view's hooks on the testbed, in the registry's words
    let hooks: serde_json::Map<String, Value> = lab_kinds()
        .map(|k| {
            let (hooks, _) = crate::views::testbed_words(k, HOST_IF, run.sample_every);
            (k.as_str().to_string(), Value::from(hooks))
        })
        .collect();
    json!({
        "scenario": name,
        "quick": plan.quick,
        "swept": plan.swept,
        "expectation": plan.expectation,
        "phases": plan.phases,
        "responder": {"command": "rttscope serve", "port": PORT},
        "active": "rttscope probe tcp-rr --nodelay (and probe icmp where the workload pings); request/response sizes and interval per phase",
        "passive": {
            "observer": run.obs_args,
            "start": run.obs_start_line,
            "hooks": hooks,
            "sample_every": run.sample_every,
            "counters": run.obs_counters,
            "unparsed_lines": run.obs_bad.0,
            "samples_of_other_flows": run.obs_bad.1,
            "selection": SELECTION,
            "left_out": left_out_total(run.data),
        },
        "emulator": records.iter().map(|r| json!({"phase": r.phase.label, "impairment": r.impairment})).collect::<Vec<_>>(),
        "cloud_buckets": crate::analysis::dist::vm_flow_preset().spec(),
    })
}

/// How the lab's rows select the passive views' samples (result.json's settings).
const SELECTION: &str = "each phase's rows hold its own request/response connections only (the probe socket's address and the responder's: the 4-tuple), from each one's first transaction to the end of its last (the probe's CLOCK_MONOTONIC times, the kernel's sample times); every other sample on the lab's port is left out and counted (left_out)";

/// SUMMARY.md's sentence on what the rows hold and what was left out.
fn left_out_sentence(data: &[PhaseData]) -> String {
    let l = left_out_total(data);
    let mut s = format!(
        "The passive columns hold each phase's own request/response connections only, from their first transaction to their last: {} of the observer's samples on port {PORT} were left out ({} of those connections outside their windows: handshake, hello, close, a last response's late ACK; {} of other connections).",
        l.total(),
        l.own_outside_window,
        l.other_connections
    );
    let dropped: u64 = data.iter().map(|d| d.observer_dropped).sum();
    if dropped > 0 {
        let at: Vec<String> = data
            .iter()
            .enumerate()
            .filter(|(_, d)| d.observer_dropped > 0)
            .map(|(i, d)| format!("phase {}: {}", i + 1, d.observer_dropped))
            .collect();
        s += &format!(
            " The observer's ring buffers dropped {dropped} samples while phases ran ({}; counted in observer_dropped): those rows may lack up to that many.",
            at.join(", ")
        );
    }
    s
}

/// One sweep point per phase, with its settings and the views that saw samples.
fn sweep_of(plan: &Plan, points: &[Vec<ViewSummary>], data: &[PhaseData]) -> Sweep {
    Sweep {
        parameter: plan.swept.split(" (").next().unwrap_or(plan.swept).to_string(),
        unit: swept_unit(plan).into(),
        points: points
            .iter()
            .enumerate()
            .map(|(i, v)| SweepPoint {
                x: x_of(plan, i),
                settings: json!({"label": plan.phases[i].label, "workload": plan.phases[i].workload, "up": plan.phases[i].up, "down": plan.phases[i].down, "duration_ms": ms(plan.phases[i].duration), "flows": data[i].flows, "left_out": data[i].left_out, "observer_dropped": data[i].observer_dropped, "rr_failed": data[i].rr_failed, "ping_lost": data[i].ping_lost, "connect_failed": data[i].connect_failed, "bulk": data[i].bulk}),
                views: v.iter().filter(|s| s.count > 0).cloned().collect(),
            })
            .collect(),
    }
}

/// The samples of every view over all phases as series (capped per view so
/// the file stays small).
fn push_sample_series(rr: &mut RunResult, data: &[PhaseData], t0: f64) {
    const CAP: usize = 20_000;
    for v in lab_views() {
        let mut all: Vec<(f64, f64)> = data
            .iter()
            .flat_map(|d| d.series(&v).iter().copied())
            .collect();
        if all.is_empty() {
            continue;
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let step = all.len().div_ceil(CAP).max(1);
        let mut vs = ViewSeries::new(v.name, v.kind);
        vs.side = Some(v.side.as_str().into());
        if step > 1 {
            vs.dropped.insert(
                "thinned_for_file".into(),
                (all.len() - all.len().div_ceil(step)) as u64,
            );
        }
        vs.samples = all
            .iter()
            .step_by(step)
            .map(|&(t, r)| Sample::at_s((t - t0).max(0.0), r))
            .collect();
        rr.views.push(vs);
    }
}

/// The sweep chart (several phases) and the time series (one phase, or the
/// RTT step), as PNG and SVG; a chart that cannot be drawn is said and skipped.
fn draw_charts(rr: &RunResult, plan: &Plan, sweep_kind: bool, out: &Path) -> Vec<PathBuf> {
    use crate::sinks::chart::ChartKind;
    let mut charts = Vec::new();
    let mut draw = |kind, stem: &str, what: &str| {
        let opts = crate::sinks::chart::ChartOptions {
            kind,
            ..Default::default()
        };
        for ext in ["png", "svg"] {
            let p = out.join(format!("{stem}.{ext}"));
            match crate::sinks::chart::render_file(rr, &opts, &p) {
                Ok(()) => charts.push(p),
                Err(e) => eprintln!("rttscope: {what} chart not drawn: {e:#}"),
            }
        }
    };
    if sweep_kind {
        draw(ChartKind::Sweep, "sweep", "sweep");
    }
    if plan.scenario == Scenario::RttStep || !sweep_kind {
        draw(ChartKind::Timeseries, "timeseries", "time-series");
    }
    charts
}

/// SUMMARY.md's legend of the table's columns: the request/response probe's, then each passive
/// view's in the registry's words, then the cloud metric's medians of the views read as it.
fn legend(sample_every: u32) -> String {
    let mut s =
        "RTTs in ms; RR = `rttscope probe tcp-rr` (request/response, per transaction)".to_string();
    for k in lab_kinds() {
        let (_, what) = crate::views::testbed_words(k, HOST_IF, sample_every);
        s += &format!(", {} = {what}", k.short_name());
    }
    for k in lab_kinds().filter(|k| k.cloud_metric()) {
        s += &format!(
            ", CLOUD_P50 = the {}'s median read from the vm_flow/rtt bucket layout",
            k.as_str()
        );
    }
    s + "."
}

/// SUMMARY.md: what was run and expected, the table, the observations and the files.
fn summary_markdown(
    run: &RunInfo,
    plan: &Plan,
    name: &str,
    t0: f64,
    table: &Table,
    obs: &[String],
    charts: &[PathBuf],
) -> String {
    let mut md = format!(
        "# lab {name}{}\n\n{}\n\nExpected: {}.\n\n{}\n\n",
        if plan.quick { " (quick)" } else { "" },
        crate::analysis::results::rfc3339_utc(t0),
        plan.expectation,
        legend(run.sample_every),
    );
    md += &table.markdown();
    md += "\n";
    for o in obs {
        md += &format!("- {o}\n");
    }
    md += &format!("\n{}\n", left_out_sentence(run.data));
    md += "\nFiles: `result.json` (settings, per-phase summaries, samples), `summary.csv`, `plan.json`, `phases.json` (link settings and emulator counters per phase)";
    for c in charts {
        md += &format!(
            ", `{}`",
            c.file_name().unwrap_or_default().to_string_lossy()
        );
    }
    md += ".\n";
    md
}

/// The lab's report (result.json, summary.csv, SUMMARY.md) of every scenario for made-up
/// phase data is byte-identical to tests/fixtures/lab/report.txt (result.json without its
/// `created` time and `host`). Regenerate with RTTSCOPE_WRITE_GOLDEN=1; with
/// RTTSCOPE_LAB_REPORT_DIR=DIR the report files (charts too) are kept in DIR/<scenario>/.
#[cfg(test)]
mod report_golden {
    use super::super::phase::LeftOut;
    use super::super::{LabEnv, BULK_PORT};
    use super::*;
    use crate::lab::scenarios::{self, LabArgs};

    /// Phase `i`'s made-up samples: 200 per view, spread over the phase, RTTs that depend on
    /// the phase and the view, with a deterministic spread.
    fn phase_data(plan: &Plan, i: usize, t0: f64) -> PhaseData {
        let start = t0 + 100.0 * i as f64;
        let len = plan.phases[i].duration.as_secs_f64();
        let series = |base_us: f64, salt: u64| -> Vec<(f64, f64)> {
            (0..200u64)
                .map(|k| {
                    let noise = ((k * 7919 + salt * 104_729) % 1000) as f64 / 1000.0;
                    let step = if (k / 25) % 2 == 1 { 2.0 } else { 1.0 };
                    (
                        start + len * k as f64 / 200.0,
                        base_us * step * (1.0 + noise),
                    )
                })
                .collect()
        };
        let b = 150.0 * (i as f64 + 1.0);
        PhaseData {
            start_unix: start,
            end_unix: start + len,
            rr: series(b, 1),
            ping: if i.is_multiple_of(2) { series(b * 0.9, 2) } else { Vec::new() },
            connect: if i.is_multiple_of(2) { series(b * 0.95, 7) } else { Vec::new() },
            passive: {
                use crate::analysis::flow::Side;
                use crate::views::ViewKind as V;
                [
                    ((V::Tcp, Side::Client), series(b * 0.8, 3)),
                    ((V::Tcp, Side::Server), series(b * 1.3, 4)),
                    ((V::Sampler, Side::Client), series(b * 0.85, 5)),
                    ((V::Sampler, Side::Server), series(b * 1.4, 6)),
                ]
                .into_iter()
                .collect()
            },
            rr_failed: i as u64,
            ping_lost: 2 * i as u64,
            connect_failed: i as u64,
            bulk: (plan.scenario == Scenario::Bufferbloat && i > 0).then(
                || json!({"tool": "iperf3 -R", "port": BULK_PORT, "received_bps": 9.5e6 - i as f64, "sender_congestion": "cubic"}),
            ),
            flows: i + 1,
            own: Vec::new(),
            left_out: LeftOut {
                own_outside_window: 2 + i as u64,
                other_connections: 3 * i as u64,
            },
            observer_dropped: if i == 1 { 7 } else { 0 },
            drops_before: 0,
        }
    }

    fn report_of(scenario: Scenario, keep: Option<&Path>) -> String {
        let args = LabArgs {
            scenario,
            quick: true,
            out: None,
            json: None,
            plan: false,
            no_progress: true,
            hold: false,
            hold_for: None,
        };
        let plan = scenarios::plan(scenario, true);
        let mut env = LabEnv::new(&args).unwrap();
        let t0 = 1_795_000_000.0;
        env.run_start_unix = Some(t0);
        env.data = (0..plan.phases.len())
            .map(|i| phase_data(&plan, i, t0))
            .collect();
        let name = scenario.to_possible_value().unwrap().get_name().to_string();
        let out = match keep {
            Some(d) => d.join(&name),
            None => {
                std::env::temp_dir().join(format!("rts-lab-report-{}-{name}", std::process::id()))
            }
        };
        std::fs::create_dir_all(&out).unwrap();
        write_report(&env.run_info(), &plan, &[], &out).unwrap();
        let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
        // summary.csv: every line has the header's number of fields (RFC 4180: a comma inside
        // quotes is not a separator; the bufferbloat header's "(KiB queue, 0 = idle)" is quoted).
        let fields = |l: &str| {
            l.chars()
                .fold((1, false), |(n, q), c| match c {
                    '"' => (n, !q),
                    ',' if !q => (n + 1, q),
                    _ => (n, q),
                })
                .0
        };
        let csv = read("summary.csv");
        let head = fields(csv.lines().next().unwrap());
        for l in csv.lines() {
            assert_eq!(fields(l), head, "{name} summary.csv: {l}");
        }
        let mut doc: Value = serde_json::from_str(&read("result.json")).unwrap();
        let o = doc.as_object_mut().unwrap();
        o.remove("created");
        o.remove("host");
        // The build (commit, loaders, features, linkage) changes as the machine does.
        let tool = o["tool"].as_object_mut().unwrap();
        tool.retain(|k, _| k == "name" || k == "version");
        // The samples as their count and a hash (FNV-1a of their JSON), to keep the file small.
        for v in o["views"].as_array_mut().unwrap() {
            let s = v["samples"].to_string();
            let h = s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
            let n = v["samples"].as_array().map_or(0, |a| a.len());
            v["samples"] = json!(format!("{n} samples, fnv1a64 {h:016x}"));
        }
        let text = format!(
            "==== {name} result.json\n{}\n==== {name} summary.csv\n{}==== {name} SUMMARY.md\n{}",
            serde_json::to_string_pretty(&doc).unwrap(),
            read("summary.csv"),
            read("SUMMARY.md")
        );
        if keep.is_none() {
            let _ = std::fs::remove_dir_all(&out);
        }
        text
    }

    #[test]
    fn lab_report_is_unchanged() {
        let keep = std::env::var_os("RTTSCOPE_LAB_REPORT_DIR").map(PathBuf::from);
        let got: String = Scenario::value_variants()
            .iter()
            .map(|&s| report_of(s, keep.as_deref()))
            .collect();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/lab/report.txt");
        if std::env::var_os("RTTSCOPE_WRITE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &got).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "the lab's report differs from {}; if the change is meant, regenerate it with \
             RTTSCOPE_WRITE_GOLDEN=1 cargo test -p rttscope --features rttscope/aya -- \
             lab_report_is_unchanged",
            path.display()
        );
    }
}
