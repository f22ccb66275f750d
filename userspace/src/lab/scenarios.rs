//! The lab's scenarios as data (phases: link settings, workload, length),
//! and the runner that builds the testbed, sets the link, runs each phase
//! through a [`ScenarioEnv`] and records everything.
//!
//! The runner does not measure by itself: probing (active view), observing
//! (TCP and sampler views) and the report (table, CSV, charts, summary) come
//! from a [`ScenarioEnv`]. Until the real one is wired in, [`Unwired`] says
//! which view is missing and the command exits non-zero — no made-up results.
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::emulator::{Direction, Impairment, ImpairmentReport, LinkConfig};
use super::signals;
use super::testbed::Testbed;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Request/response interval swept through the delayed-ACK timer (0..50 ms): the responder's TCP RTT grows with it.
    DelayedAck,
    /// Intervals beyond the ACK timer (100 ms..5 s, two-segment requests): TCP RTT flat, sampler not.
    BeyondAckTimer,
    /// 50 ms added to and removed from the path periodically: how fast each view follows.
    RttStep,
    /// Random loss 0..10 %: retransmissions, Karn, the probe tail.
    Loss,
    /// A bulk flow through a 10 Mbit/s bottleneck with a shallow and a deep queue.
    Bufferbloat,
    /// The same path probed back-to-back, every 10 ms, 100 ms and 1 s (ping and request/response).
    ProbeInterval,
}

#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// The scenario to run.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Short form (under about a minute) instead of the full length.
    #[arg(long)]
    pub quick: bool,
    /// Results directory [default: results/<scenario>-<UTC time>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also write the result document (OUT/result.json, docs/results.md) to FILE; `-` prints it
    /// on standard output and everything else goes to stderr.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print the scenario's phase plan (JSON) and exit, without building anything.
    #[arg(long)]
    pub plan: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Build the testbed with the scenario's first link settings, print its
    /// namespaces and addresses, and keep it until Ctrl-C / SIGTERM (or
    /// --hold-for) — for experiments by hand (`ip netns exec <ns> ...`).
    #[arg(long)]
    pub hold: bool,
    /// With --hold: remove the testbed after this long (a duration with a unit).
    #[arg(long, value_name = "DURATION", value_parser = crate::analysis::units::duration_arg, requires = "hold")]
    pub hold_for: Option<Duration>,
}

/// The traffic of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Workload {
    /// TCP request/response between client and server (netperf TCP_RR-like):
    /// `request`/`response` bytes, `interval` of idle time between a response
    /// and the next request, `sessions` parallel connections.
    TcpRr {
        request: usize,
        response: usize,
        #[serde(serialize_with = "ser_ms", rename = "interval_ms")]
        interval: Duration,
        sessions: u32,
    },
    /// ICMP echo and TCP request/response probes at the same interval.
    PingAndRr {
        #[serde(serialize_with = "ser_ms", rename = "interval_ms")]
        interval: Duration,
    },
    /// A bulk TCP flow in direction `bulk` (down = server sends) while
    /// ping and request/response probes run at `probe_interval`.
    BulkWithProbes {
        bulk: Direction,
        #[serde(serialize_with = "ser_ms", rename = "probe_interval_ms")]
        probe_interval: Duration,
    },
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A link change at an offset into the phase (rtt-step).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkStep {
    #[serde(serialize_with = "ser_ms", rename = "at_ms")]
    pub at: Duration,
    pub direction: Direction,
    pub link: LinkConfig,
}

/// One phase: link settings, workload and length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// Row label in the scenario's table (the swept value).
    pub label: String,
    pub up: LinkConfig,
    pub down: LinkConfig,
    pub workload: Workload,
    #[serde(serialize_with = "ser_ms", rename = "duration_ms")]
    pub duration: Duration,
    /// Link changes during the phase, in time order.
    pub steps: Vec<LinkStep>,
}

/// A scenario's whole plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub scenario: Scenario,
    pub quick: bool,
    /// What the phases sweep (the table's first column).
    pub swept: &'static str,
    /// What the scenario should show (goes into the summary).
    pub expectation: &'static str,
    pub phases: Vec<Phase>,
}

impl Plan {
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }
}

const MS: fn(u64) -> Duration = Duration::from_millis;

fn base(one_way_ms: u64) -> LinkConfig {
    LinkConfig::delay(MS(one_way_ms))
}

fn phase(label: String, link: LinkConfig, workload: Workload, duration: Duration) -> Phase {
    Phase {
        label,
        up: link,
        down: link,
        workload,
        duration,
        steps: Vec::new(),
    }
}

/// What a scenario sweeps, what it should show, and its phases.
type PlanParts = (&'static str, &'static str, Vec<Phase>);

/// The plan of `scenario` in its quick or full form.
pub fn plan(scenario: Scenario, quick: bool) -> Plan {
    let (swept, expectation, phases) = match scenario {
        Scenario::DelayedAck => delayed_ack(quick),
        Scenario::BeyondAckTimer => beyond_ack_timer(quick),
        Scenario::RttStep => rtt_step(quick),
        Scenario::Loss => loss(quick),
        Scenario::Bufferbloat => bufferbloat(quick),
        Scenario::ProbeInterval => probe_interval(quick),
    };
    Plan {
        scenario,
        quick,
        swept,
        expectation,
        phases,
    }
}

/// The delayed-ACK sweep: request/response intervals 0..41 ms on an undelayed path.
fn delayed_ack(quick: bool) -> PlanParts {
    // The Google note's sweep (netperf -w -1,1,2,..,41 ms -r 1,2) on an
    // undelayed path (its VMs were ~0.1 ms apart): with a path RTT far
    // below the interval, the probe's pacing period is the idle time.
    let len = if quick { MS(1_800) } else { MS(30_000) };
    (
        "request/response interval (ms)",
        "undelayed path (~0.1 ms); the server's TCP RTT grows with the interval until the client's delayed-ACK timer (~40 ms) caps it; the client's TCP RTT and the request/response latency stay small",
        [0u64, 1, 2, 4, 8, 16, 32, 39, 40, 41]
            .iter()
            .map(|&i| {
                let w = Workload::TcpRr { request: 1, response: 2, interval: MS(i), sessions: 1 };
                phase(format!("{i}"), LinkConfig::default(), w, len)
            })
            .collect(),
    )
}

/// Intervals beyond the delayed-ACK timer (100 ms..5 s), two-segment requests.
fn beyond_ack_timer(quick: bool) -> PlanParts {
    // (interval ms, phase length s); sessions grow with the interval
    // (1 per 100 ms) to keep the packet rate similar, as in the note. The
    // quick form has three times the sessions (30 at 1 s, under serve's 32 per
    // peer) and a 14 s last phase: its sampler samples 1 packet in 4, and
    // ~390 transactions at 1 s give tests/tests/lab_scenarios.rs the odds it states.
    let ints: &[(u64, u64)] = if quick {
        &[(100, 6), (300, 6), (1000, 14)]
    } else {
        &[
            (100, 60),
            (300, 60),
            (500, 60),
            (1000, 60),
            (3000, 90),
            (5000, 120),
        ]
    };
    (
        "request/response interval (ms)",
        "beyond the delayed-ACK timer the client ACKs a response at once: TCP RTT stays at the path RTT (10 ms) at every interval, while a sampler that misses that ACK pairs the response with the next request and sees the interval",
        ints.iter()
            .map(|&(i, len)| {
                // 1449-byte requests: two segments at MSS 1448, as
                // the note's 1409 bytes were at GCE's MSS 1408.
                let w = Workload::TcpRr {
                    request: 1449,
                    response: 2,
                    interval: MS(i),
                    sessions: (i / 100).max(1) as u32 * if quick { 3 } else { 1 },
                };
                phase(format!("{i}"), base(5), w, Duration::from_secs(len))
            })
            .collect(),
    )
}

/// 50 ms added to and removed from the client->server direction periodically.
fn rtt_step(quick: bool) -> PlanParts {
    let (half, cycles) = if quick {
        (MS(5_000), 2)
    } else {
        (MS(30_000), 5)
    };
    let low = base(50);
    let high = LinkConfig::delay(MS(100));
    let mut steps = Vec::new();
    for c in 0..cycles {
        let t0 = half * 2 * c;
        steps.push(LinkStep {
            at: t0 + half,
            direction: Direction::Up,
            link: high,
        });
        steps.push(LinkStep {
            at: t0 + half * 2,
            direction: Direction::Up,
            link: low,
        });
    }
    let dur = half * 2 * cycles;
    steps.retain(|s| s.at < dur);
    (
        "time (s)",
        "the path RTT steps between 100 ms and 150 ms (50 ms added on the client->server direction); probes follow at once, TCP's smoothed RTT within a few round trips, a windowed metric only at its next window",
        vec![Phase {
            label: "step".into(),
            up: low,
            down: low,
            workload: Workload::PingAndRr { interval: MS(100) },
            duration: dur,
            steps,
        }],
    )
}

/// Random loss each way on a 100 ms path.
fn loss(quick: bool) -> PlanParts {
    let rr = |request, interval, sessions| Workload::TcpRr {
        request,
        response: 1,
        interval,
        sessions,
    };
    let (levels, len): (&[f64], u64) = if quick {
        (&[0.0, 5.0, 10.0, 20.0], 8)
    } else {
        (&[0.0, 5.0, 10.0, 15.0, 20.0], 60)
    };
    (
        "random loss each way (%)",
        "path RTT 100 ms; with loss the request/response tail (p95) jumps by retransmission timeouts (>= 200 ms) while TCP's median RTT stays near 100 ms and its tail rises less often (Karn: no sample from retransmitted data, but with timestamps an ACK echoing the first transmission's TSval - a lost response the server resent - yields a sample that includes the RTO); the sampler (no Karn) follows the transactions",
        levels
            .iter()
            .map(|&l| {
                let link = LinkConfig { loss_pct: l, ..base(50) };
                phase(format!("{l}"), link, rr(1, MS(10), 3), Duration::from_secs(len))
            })
            .collect(),
    )
}

/// Idle, then a bulk download through a shallow and a deep queue at 10 Mbit/s.
fn bufferbloat(quick: bool) -> PlanParts {
    let len = Duration::from_secs(if quick { 12 } else { 60 });
    let probe = MS(100);
    let rate = 10_000_000;
    let bottleneck = |limit| LinkConfig {
        rate_bps: Some(rate),
        queue_limit: Some(limit),
        ..base(5)
    };
    let idle = Phase {
        label: "idle".into(),
        down: bottleneck(16 * 1024),
        ..phase(
            String::new(),
            base(5),
            Workload::PingAndRr { interval: probe },
            len,
        )
    };
    let bulk = |label: &str, limit| Phase {
        label: label.into(),
        down: bottleneck(limit),
        ..phase(
            String::new(),
            base(5),
            Workload::BulkWithProbes {
                bulk: Direction::Down,
                probe_interval: probe,
            },
            len,
        )
    };
    (
        "queue at the 10 Mbit/s bottleneck (server->client)",
        "idle: RTT 10 ms; a bulk download through a shallow queue (16 KiB, ~13 ms at 10 Mbit/s) adds little; through a deep queue (1 MiB, ~840 ms) every view's RTT rises by hundreds of ms",
        vec![idle, bulk("shallow 16KiB", 16 * 1024), bulk("deep 1MiB", 1024 * 1024)],
    )
}

/// The same undelayed path probed back to back, every 10 ms, 100 ms and 1 s.
fn probe_interval(quick: bool) -> PlanParts {
    let ints: &[(u64, u64)] = if quick {
        &[(0, 2), (10, 5), (100, 8), (1000, 15)]
    } else {
        &[(0, 30), (10, 30), (100, 60), (1000, 120)]
    };
    (
        "probe interval (ms)",
        "the same undelayed path measured with ping and request/response at different intervals: the sparser the probes, the higher the latency (idle CPUs wake up, caches are cold), so the interval must be recorded with every result",
        ints.iter()
            .map(|&(i, len)| {
                let label = if i == 0 { "back-to-back".to_string() } else { format!("{i}") };
                phase(label, LinkConfig::default(), Workload::PingAndRr { interval: MS(i) }, Duration::from_secs(len))
            })
            .collect(),
    )
}

/// What a phase produced, with its settings and the router's counters.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRecord {
    pub phase: Phase,
    #[serde(serialize_with = "ser_ms", rename = "started_after_ms")]
    pub started_after: Duration,
    /// Link settings and emulator/loss counters at the end of the phase.
    pub impairment: ImpairmentReport,
    /// The active view's results (from [`ScenarioEnv::probe`]).
    pub probe: serde_json::Value,
    /// The passive views' results (from [`ScenarioEnv::observe_stop`]).
    pub observe: serde_json::Value,
}

/// Progress reporting handed to the probe: `advance` to a time offset into the phase.
pub trait Progress {
    fn at(&self, into_phase: Duration);
}

/// What a scenario needs beyond the testbed: the responder, the views and the
/// report. The lead fills this with `serve`, `probe`, `observe`, `compare`.
pub trait ScenarioEnv {
    /// Views/commands this environment cannot provide yet (empty when complete).
    fn missing(&self) -> Vec<&'static str>;
    /// Start the responder (`rttscope serve`) in the server namespace
    /// (use `tb.spawn(Role::Srv, ..)` so it is stopped with the testbed).
    fn start_server(&mut self, tb: &Testbed) -> Result<()>;
    /// Start the passive views on both ends for a phase.
    fn observe_start(&mut self, tb: &Testbed, phase: &Phase) -> Result<()>;
    /// Run the phase's workload for `phase.duration` (check
    /// `signals::check()` at least every 100 ms; report progress).
    fn probe(
        &mut self,
        tb: &Testbed,
        phase: &Phase,
        progress: &dyn Progress,
    ) -> Result<serde_json::Value>;
    /// Stop the passive views; their results for the phase.
    fn observe_stop(&mut self) -> Result<serde_json::Value>;
    /// Write the table, CSV, charts and summary into `out`; return the files written.
    fn report(&mut self, plan: &Plan, records: &[PhaseRecord], out: &Path) -> Result<Vec<PathBuf>>;
}

/// The environment until the views are wired into the lab.
pub struct Unwired;

impl ScenarioEnv for Unwired {
    fn missing(&self) -> Vec<&'static str> {
        vec![
            "the responder (`rttscope serve`)",
            "the active view (`rttscope probe`)",
            "the passive views (`rttscope observe`)",
            "the report (`rttscope compare`)",
        ]
    }
    fn start_server(&mut self, _: &Testbed) -> Result<()> {
        bail!("the responder is not available in the lab yet")
    }
    fn observe_start(&mut self, _: &Testbed, _: &Phase) -> Result<()> {
        bail!("the passive views are not available in the lab yet")
    }
    fn probe(&mut self, _: &Testbed, _: &Phase, _: &dyn Progress) -> Result<serde_json::Value> {
        bail!("the active view is not available in the lab yet")
    }
    fn observe_stop(&mut self) -> Result<serde_json::Value> {
        bail!("the passive views are not available in the lab yet")
    }
    fn report(&mut self, _: &Plan, _: &[PhaseRecord], _: &Path) -> Result<Vec<PathBuf>> {
        bail!("the report is not available in the lab yet")
    }
}

struct Bar {
    bar: Option<indicatif::ProgressBar>,
    base: Mutex<Duration>,
}

impl Progress for Bar {
    fn at(&self, into_phase: Duration) {
        if let Some(b) = &self.bar {
            b.set_position((*self.base.lock().unwrap() + into_phase).as_millis() as u64);
        }
    }
}

/// `rttscope lab` with the default environment.
pub fn run(args: LabArgs) -> Result<()> {
    run_with(args, &mut Unwired)
}

/// `rttscope lab` with a given environment (the lead's wiring, or tests).
pub fn run_with(args: LabArgs, env: &mut dyn ScenarioEnv) -> Result<()> {
    let plan = plan(args.scenario, args.quick);
    if args.plan {
        return print_ignoring_broken_pipe(&serde_json::to_string_pretty(&plan)?);
    }
    if args.hold {
        return hold(&plan, args.hold_for);
    }
    let missing = env.missing();
    if !missing.is_empty() {
        bail!(
            "the {} scenario cannot run yet: not wired into the lab: {} (try --plan to see what it would run)",
            args.scenario.to_possible_value().unwrap().get_name(),
            missing.join(", ")
        );
    }
    signals::install()?;
    let out = args.out.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from("lab-results").join(format!(
            "{}-{t}",
            args.scenario.to_possible_value().unwrap().get_name()
        ))
    });
    let files = run_plan(&plan, &out, !args.no_progress, env)?;
    println!("results in {}", out.display());
    for f in files {
        println!("  {}", f.display());
    }
    Ok(())
}

/// Run a plan (the scenario's, or any other) with `env`, writing
/// `plan.json` and `phases.json` into `out`; returns the files the report wrote.
/// Install the signal handlers (`signals::install`) first for Ctrl-C handling.
pub fn run_plan(
    plan: &Plan,
    out: &Path,
    progress: bool,
    env: &mut dyn ScenarioEnv,
) -> Result<Vec<PathBuf>> {
    crate::sys::files::create_output_dir(out)
        .with_context(|| format!("creating {}", out.display()))?;
    crate::sys::files::write_atomically(&out.join("plan.json"), &serde_json::to_vec_pretty(&plan)?)
        .with_context(|| format!("writing {}", out.join("plan.json").display()))?;

    let tb = Testbed::new()?;
    let mut imp = Impairment::new(&tb)?;
    env.start_server(&tb)
        .context("starting the responder in the server namespace")?;

    let bar = Bar::new(plan, progress);
    let start = Instant::now();
    let mut records = Vec::new();
    for (i, ph) in plan.phases.iter().enumerate() {
        signals::check()?;
        if let Some(b) = &bar.bar {
            b.set_message(format!(
                "phase {}/{}: {} = {}",
                i + 1,
                plan.phases.len(),
                plan.swept,
                ph.label
            ));
        }
        records.push(run_phase(env, &tb, &mut imp, (i, ph), &bar, start)?);
        *bar.base.lock().unwrap() += ph.duration;
        crate::sys::files::write_atomically(
            &out.join("phases.json"),
            &serde_json::to_vec_pretty(&records)?,
        )?;
    }
    if let Some(b) = &bar.bar {
        b.finish_and_clear();
    }
    imp.shutdown()?;
    drop(tb);
    env.report(plan, &records, out)
}

impl Bar {
    /// The progress bar over the plan's whole length (none without `progress`).
    fn new(plan: &Plan, progress: bool) -> Bar {
        Bar {
            bar: progress.then(|| {
                let b = indicatif::ProgressBar::new(plan.total().as_millis() as u64);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{prefix} [{bar:40}] {elapsed}/{duration} {msg}",
                    )
                    .unwrap()
                    .progress_chars("=> "),
                );
                b.set_prefix(format!(
                    "lab {}",
                    plan.scenario.to_possible_value().unwrap().get_name()
                ));
                b
            }),
            base: Mutex::new(Duration::ZERO),
        }
    }
}

/// Phase `i` of the plan: set the link, observe, probe while the link steps
/// are applied, stop observing; its record.
fn run_phase(
    env: &mut dyn ScenarioEnv,
    tb: &Testbed,
    imp: &mut Impairment,
    (i, ph): (usize, &Phase),
    bar: &Bar,
    start: Instant,
) -> Result<PhaseRecord> {
    imp.set(Direction::Up, ph.up)?;
    imp.set(Direction::Down, ph.down)?;
    let started_after = start.elapsed();
    env.observe_start(tb, ph)?;
    let imp_m = Mutex::new(&mut *imp);
    let done = std::sync::atomic::AtomicBool::new(false);
    let probe = std::thread::scope(|s| -> Result<serde_json::Value> {
        let stepper = s.spawn(|| -> Result<()> { apply_steps(ph, &imp_m, &done) });
        let r = env.probe(tb, ph, bar);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        stepper
            .join()
            .map_err(|_| anyhow::anyhow!("link step thread panicked"))??;
        r
    })?;
    let observe = env.observe_stop()?;
    if !imp.emulator().alive() {
        bail!(
            "the delay emulator stopped during phase {} ({}): the results would be without the configured delay",
            i + 1,
            ph.label
        );
    }
    Ok(PhaseRecord {
        phase: ph.clone(),
        started_after,
        impairment: imp.report(),
        probe,
        observe,
    })
}

/// Print a line to stdout; a closed pipe (`| head`) is not an error.
fn print_ignoring_broken_pipe(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to stdout"),
    }
}

/// `--hold`: the testbed with the first phase's link, until a signal.
fn hold(plan: &Plan, hold_for: Option<Duration>) -> Result<()> {
    use super::testbed::{Role, CLI_ADDR, CLI_ADDR6, SRV_ADDR, SRV_ADDR6};
    signals::install()?;
    let tb = Testbed::new()?;
    let mut imp = Impairment::new(&tb)?;
    let ph = &plan.phases[0];
    imp.set(Direction::Up, ph.up)?;
    imp.set(Direction::Down, ph.down)?;
    print_ignoring_broken_pipe(&format!("testbed up: client {} ({CLI_ADDR}, {CLI_ADDR6}), router {}, server {} ({SRV_ADDR}, {SRV_ADDR6})",
        tb.ns(Role::Cli),
        tb.ns(Role::Rtr),
        tb.ns(Role::Srv)
    ))?;
    print_ignoring_broken_pipe(&format!(
        "link up (client->server): {}",
        serde_json::to_string(&ph.up)?
    ))?;
    print_ignoring_broken_pipe(&format!(
        "link down (server->client): {}",
        serde_json::to_string(&ph.down)?
    ))?;
    print_ignoring_broken_pipe(&format!(
        "holding until Ctrl-C / SIGTERM{}",
        match hold_for {
            Some(d) => format!(" or {}", crate::analysis::units::fmt_duration_short(d)),
            None => String::new(),
        }
    ))?;
    let end = hold_for.map(|d| Instant::now() + d);
    while !signals::cancelled() && end.is_none_or(|e| Instant::now() < e) {
        if !imp.emulator().alive() {
            bail!("the delay emulator stopped");
        }
        std::thread::sleep(MS(50));
    }
    let report = imp.report();
    imp.shutdown()?;
    drop(tb);
    print_ignoring_broken_pipe(&format!("counters: {}", serde_json::to_string(&report)?))?;
    print_ignoring_broken_pipe("testbed removed")?;
    Ok(())
}

/// Apply a phase's link steps at their offsets until `done`.
fn apply_steps(
    ph: &Phase,
    imp: &Mutex<&mut Impairment>,
    done: &std::sync::atomic::AtomicBool,
) -> Result<()> {
    let t0 = Instant::now();
    for st in &ph.steps {
        loop {
            if done.load(std::sync::atomic::Ordering::Relaxed) || signals::cancelled() {
                return Ok(());
            }
            let el = t0.elapsed();
            if el >= st.at {
                break;
            }
            std::thread::sleep((st.at - el).min(MS(20)));
        }
        imp.lock().unwrap().set(st.direction, st.link)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_plans_are_under_about_a_minute() {
        for s in Scenario::value_variants() {
            let p = plan(*s, true);
            assert!(!p.phases.is_empty(), "{s:?}");
            assert!(
                p.total() <= Duration::from_secs(60),
                "{s:?} quick takes {:?}",
                p.total()
            );
            let full = plan(*s, false);
            assert!(full.total() > p.total(), "{s:?}");
            for ph in p.phases.iter().chain(full.phases.iter()) {
                ph.up.validate().unwrap();
                ph.down.validate().unwrap();
                assert!(ph.steps.windows(2).all(|w| w[0].at <= w[1].at));
                assert!(ph.steps.iter().all(|s| s.at < ph.duration));
            }
        }
    }

    #[test]
    fn rtt_step_alternates() {
        let p = plan(Scenario::RttStep, true);
        let steps = &p.phases[0].steps;
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[0].link.delay, MS(100));
        assert_eq!(steps[1].link.delay, MS(50));
        assert_eq!(steps[2].at, MS(15_000));
    }

    #[test]
    fn delayed_ack_sweeps_through_the_timer() {
        let p = plan(Scenario::DelayedAck, false);
        let ints: Vec<Duration> = p
            .phases
            .iter()
            .map(|ph| match ph.workload {
                Workload::TcpRr { interval, .. } => interval,
                _ => panic!("not RR"),
            })
            .collect();
        assert!(ints.contains(&MS(0)) && ints.contains(&MS(16)) && ints.contains(&MS(41)));
    }

    #[test]
    fn unwired_says_what_is_missing() {
        let args = LabArgs {
            scenario: Scenario::Loss,
            quick: true,
            out: None,
            json: None,
            plan: false,
            no_progress: true,
            hold: false,
            hold_for: None,
        };
        let e = run_with(args, &mut Unwired).unwrap_err().to_string();
        assert!(
            e.contains("active view") && e.contains("rttscope probe"),
            "{e}"
        );
    }

    #[test]
    fn plan_serialises_settings() {
        let j = serde_json::to_value(plan(Scenario::Bufferbloat, true)).unwrap();
        let deep = &j["phases"][2];
        assert_eq!(deep["down"]["queue_limit_bytes"], 1024 * 1024);
        assert_eq!(deep["down"]["rate_bps"], 10_000_000);
        assert_eq!(deep["workload"]["kind"], "bulk-with-probes");
        assert_eq!(deep["up"]["delay_us"], 5000);
        assert_eq!(deep["duration_ms"], 12000.0);
    }
}
