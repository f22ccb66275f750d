//! The lab's real environment: `rttscope serve` in the server namespace,
//! `rttscope probe`'s probes in this process on threads inside the client
//! namespace (active view; each tells the 4-tuple of its connection and its
//! window), observe's session in this process on a thread of its own, from
//! the host namespace, for the whole run (TCP view on both ends, sampler on
//! both ends' veths: [`super::observer`]), whose samples each phase selects by
//! its own connections' 4-tuples and windows, and the report (result.json,
//! summary.csv, charts, SUMMARY.md).
//!
//! Every process is a child of this one, started with PR_SET_PDEATHSIG from
//! the thread that runs the scenario (it outlives them all), and stopped
//! when its phase (bulk flow) or the run (responder) ends; the probe threads
//! are cancelled and joined when their phase fails; the observer's session is
//! stopped and dropped (its programs detached) after the last phase, or when
//! the run fails.
//!
//! - [`phase`]: what a phase measured, its own connections, what it left out, its statistics.
//! - [`probes`]: the probes and the bulk flow of a phase, and their results.
//! - [`report`]: result.json, summary.csv, the charts and SUMMARY.md
//!   ([`table`]: the summary table; [`observations`]: the sentences on what the run showed).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use serde_json::{json, Value};

use super::observer::Observer;
use crate::analysis::records;
use crate::lab::scenarios::{
    self, LabArgs, Phase, PhaseRecord, Plan, Progress, Scenario, ScenarioEnv,
};
use crate::lab::signals;
use crate::lab::testbed::{Role, Testbed, SRV_ADDR};

mod observations;
mod phase;
mod probes;
mod report;
mod table;

pub use phase::cloud_p50_us;
use phase::{summary_json, PhaseData};
use probes::{
    cancel_all, finish_bulk, probe_result, start_workload, wait_for_probes, ProbeRun, Running,
};
use report::{write_report, RunInfo};

/// The responder's port; the observer only follows flows to it.
pub const PORT: u16 = 7878;
/// The bulk flow's port (bufferbloat), not observed.
pub const BULK_PORT: u16 = 5201;

/// `rttscope lab` with the real views.
pub fn run(mut args: LabArgs) -> Result<()> {
    let name = args
        .scenario
        .to_possible_value()
        .unwrap()
        .get_name()
        .to_string();
    if args.out.is_none() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let stamp = crate::analysis::results::rfc3339_utc(t).replace(':', "");
        args.out = Some(PathBuf::from("results").join(format!("{name}-{stamp}")));
    }
    let mut env = LabEnv::new(&args)?;
    scenarios::run_with(args, &mut env)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The real lab environment.
pub struct LabEnv {
    exe: PathBuf,
    out: PathBuf,
    scenario: Scenario,
    phases_total: usize,
    phase_idx: usize,
    sample_every: u32,
    observer: Option<Observer>,
    /// The observer's options (observe's), its start record and counters; its raw records
    /// that no view could decode and its samples not of the lab's port.
    obs_args: Option<Vec<String>>,
    obs_start_line: Option<records::Start>,
    obs_counters: Option<records::Counters>,
    obs_bad: (u64, u64),
    current: PhaseData,
    data: Vec<PhaseData>,
    run_start_unix: Option<f64>,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC (ns): the probes' monotonic times as Unix times.
    realtime_minus_mono_ns: i64,
    /// `--json FILE`: where the result document goes besides OUT/result.json.
    json: Option<PathBuf>,
}

impl LabEnv {
    pub fn new(args: &LabArgs) -> Result<LabEnv> {
        let exe = std::env::current_exe().context("finding the rttscope binary")?;
        let plan = scenarios::plan(args.scenario, args.quick);
        // beyond-ack-timer: a low sampling rate (1 in 4 packets) for a view that samples
        // packets, so it misses most immediate ACKs (the note's point); elsewhere every packet.
        let sample_every = match args.scenario {
            Scenario::BeyondAckTimer => 4,
            _ => 1,
        };
        Ok(LabEnv {
            exe,
            out: args.out.clone().unwrap_or_else(|| PathBuf::from(".")),
            json: args.json.clone(),
            scenario: args.scenario,
            phases_total: plan.phases.len(),
            phase_idx: 0,
            sample_every,
            observer: None,
            obs_args: None,
            obs_start_line: None,
            obs_counters: None,
            obs_bad: (0, 0),
            current: PhaseData::default(),
            data: Vec::new(),
            run_start_unix: None,
            realtime_minus_mono_ns: crate::sys::clock::realtime_minus_mono_ns(),
        })
    }

    fn exe_str(&self) -> &str {
        self.exe.to_str().unwrap_or("rttscope")
    }

    /// What the report reads of the run.
    fn run_info(&self) -> RunInfo<'_> {
        RunInfo {
            data: &self.data,
            run_start_unix: self.run_start_unix,
            json: self.json.as_deref(),
            sample_every: self.sample_every,
            obs_args: &self.obs_args,
            obs_start_line: &self.obs_start_line,
            obs_counters: &self.obs_counters,
            obs_bad: self.obs_bad,
        }
    }
}

impl ScenarioEnv for LabEnv {
    fn missing(&self) -> Vec<&'static str> {
        Vec::new()
    }

    fn start_server(&mut self, tb: &Testbed) -> Result<()> {
        let exe = self.exe_str().to_string();
        tb.spawn(
            Role::Srv,
            &[&exe, "serve", "--listen", &format!("0.0.0.0:{PORT}")],
        )?;
        if self.scenario == Scenario::Bufferbloat {
            tb.spawn(Role::Srv, &["iperf3", "-s", "-p", &BULK_PORT.to_string()])?;
        }
        // Wait until the responder accepts (TCP connect from the client namespace).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = tb
                .run_in(Role::Cli, || {
                    std::net::TcpStream::connect_timeout(
                        &std::net::SocketAddr::from((SRV_ADDR, PORT)),
                        Duration::from_millis(300),
                    )
                    .is_ok()
                })
                .unwrap_or(false);
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!("rttscope serve did not accept connections within 20 s");
            }
            signals::check()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn observe_start(&mut self, tb: &Testbed, phase: &Phase) -> Result<()> {
        if self.observer.is_none() {
            let p = self.out.join("observe.stderr");
            let obs = Observer::start(tb, self.sample_every, p)?;
            self.obs_start_line = obs.shared.lock().unwrap().start_line.clone();
            self.obs_args = Some(obs.args.clone());
            self.observer = Some(obs);
        }
        let since = self.data.last().map_or(0.0, |d| d.end_unix);
        let drops_before = match &self.observer {
            Some(o) => o.settled(since)?,
            None => 0,
        };
        let now = unix_now();
        self.run_start_unix.get_or_insert(now);
        let _ = phase;
        self.current = PhaseData {
            start_unix: now,
            drops_before,
            ..Default::default()
        };
        Ok(())
    }

    fn probe(&mut self, tb: &Testbed, phase: &Phase, progress: &dyn Progress) -> Result<Value> {
        let mut kids: Vec<ProbeRun> = Vec::new();
        let mut bulk: Option<Running> = None;
        let started = Instant::now();
        let res = start_workload(tb, phase, &mut kids, &mut bulk)
            .and_then(|()| wait_for_probes(&kids, phase, started, progress));
        if let Err(e) = res {
            cancel_all(kids);
            if let Some(b) = bulk.as_mut() {
                let _ = b.child.kill();
                let _ = b.child.wait();
            }
            return Err(e);
        }
        let mut results = Vec::new();
        for k in kids {
            results.push(probe_result(
                k,
                phase,
                &mut self.current,
                self.realtime_minus_mono_ns,
            )?);
        }
        if let Some(b) = bulk {
            self.current.bulk = Some(finish_bulk(b)?);
        }
        self.current.rr.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(json!({ "probes": results, "bulk": self.current.bulk }))
    }

    fn observe_stop(&mut self) -> Result<Value> {
        // let the last ACKs and closes reach the observer
        std::thread::sleep(Duration::from_millis(300));
        let end = unix_now();
        self.current.end_unix = end;
        self.phase_idx += 1;
        let last = self.phase_idx >= self.phases_total;
        let obs = self
            .observer
            .as_mut()
            .ok_or_else(|| anyhow!("the observer is not running"))?;
        if last {
            obs.stop();
        } else {
            obs.check_running()?;
        }
        // The drops while the phase ran: the first reading after its end (the end record's
        // when the observer was stopped).
        let after = match obs.drops_after(end, Duration::from_secs(3))? {
            Some(d) => d,
            None => obs.shared.lock().unwrap().drops.last().map_or(0, |r| r.1),
        };
        self.current.observer_dropped = after.saturating_sub(self.current.drops_before);
        {
            let s = obs.shared.lock().unwrap();
            self.current.take_observed(&s, end);
            self.obs_counters = s.counters.clone();
            self.obs_bad = (s.bad_records, s.other_port);
        }
        let d = &self.current;
        let mut v = json!({
            "observer": obs.args,
            "flows": d.flows,
            "left_out": d.left_out,
            "observer_dropped": d.observer_dropped,
            "counters_so_far": self.obs_counters,
        });
        // each passive view's statistics by side (`<view>_client`, `<view>_server`)
        for lv in phase::lab_views() {
            if let phase::Source::Passive(k) = lv.source {
                let key = format!("{}_{}", k.as_str(), lv.side.as_str());
                v[key] = summary_json(d.series(&lv));
            }
        }
        self.data.push(std::mem::take(&mut self.current));
        Ok(v)
    }

    fn report(&mut self, plan: &Plan, records: &[PhaseRecord], out: &Path) -> Result<Vec<PathBuf>> {
        if let Some(mut o) = self.observer.take() {
            o.stop();
        }
        write_report(&self.run_info(), plan, records, out)
    }
}
