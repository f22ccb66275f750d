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
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use serde_json::{json, Value};

use super::observer::{ObsShared, Observer};
use crate::analysis::records;
use crate::analysis::results::{
    RunResult, Sample, Sweep, SweepPoint, ViewKind, ViewSeries, ViewSummary,
};
use crate::lab::scenarios::{
    self, LabArgs, Phase, PhaseRecord, Plan, Progress, Scenario, ScenarioEnv, Workload,
};
use crate::lab::signals;
use crate::lab::testbed::{Role, Testbed, HOST_IF, SRV_ADDR};
use crate::sinks::table::{Align, Table};

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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A phase's request/response connection: the probe socket's own address (with the responder's
/// address and port, the connection's 4-tuple) and its window, Unix seconds from the first
/// transaction's send to the end of the last one (the probe's own CLOCK_MONOTONIC times).
#[derive(Debug, Clone, Copy, PartialEq)]
struct OwnFlow {
    local: SocketAddr,
    start: f64,
    end: f64,
}

/// The observer's samples of the lab's port that a phase's rows do not hold, and why.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
struct LeftOut {
    /// Samples of the phase's own connections before its first transaction or after its last:
    /// the handshake, the probe's hello, the close, a last response's late ACK.
    own_outside_window: u64,
    /// Samples of other connections to the lab's port while the phase ran (a connection that
    /// was open before the lab, another client in the testbed's namespaces).
    other_connections: u64,
}

impl LeftOut {
    fn total(&self) -> u64 {
        self.own_outside_window + self.other_connections
    }
}

fn pdeathsig(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// What one phase measured: samples as (unix time, RTT us).
#[derive(Debug, Default, Clone)]
struct PhaseData {
    start_unix: f64,
    end_unix: f64,
    rr: Vec<(f64, f64)>,
    ping: Vec<(f64, f64)>,
    tcp_cli: Vec<(f64, f64)>,
    tcp_srv: Vec<(f64, f64)>,
    smp_cli: Vec<(f64, f64)>,
    smp_srv: Vec<(f64, f64)>,
    rr_failed: u64,
    ping_lost: u64,
    bulk: Option<Value>,
    /// The phase's own connections with samples in their windows.
    flows: usize,
    /// The phase's request/response connections (from its probes).
    own: Vec<OwnFlow>,
    left_out: LeftOut,
    /// The observer's ring-buffer drops (any connection's samples) while the phase ran: its
    /// rows may lack up to this many. `drops_before`: the count when it started.
    observer_dropped: u64,
    drops_before: u64,
}

impl PhaseData {
    /// The observer's samples of this phase's own connections (by 4-tuple) inside their
    /// windows, by view and side; the rest of what the observer saw on the lab's port while the
    /// phase ran (`start_unix` to `end`) and its own connections' samples outside their windows
    /// are counted in `left_out`.
    fn take_observed(&mut self, s: &ObsShared, end: f64) {
        let srv = SocketAddr::from((SRV_ADDR, PORT));
        let mut seen: Vec<SocketAddr> = Vec::new();
        for r in &s.samples {
            let own = self.own.iter().find(|o| {
                (r.local == o.local && r.remote == srv) || (r.local == srv && r.remote == o.local)
            });
            let Some(o) = own else {
                if r.t_unix >= self.start_unix && r.t_unix <= end {
                    self.left_out.other_connections += 1;
                }
                continue;
            };
            if r.t_unix < o.start || r.t_unix > o.end {
                self.left_out.own_outside_window += 1;
                continue;
            }
            if !seen.contains(&o.local) {
                seen.push(o.local);
            }
            let v = (r.t_unix, r.rtt_us);
            use crate::views::ViewKind as V;
            match (r.view, r.local == srv) {
                (V::Tcp, false) => self.tcp_cli.push(v),
                (V::Tcp, true) => self.tcp_srv.push(v),
                (V::Sampler, false) => self.smp_cli.push(v),
                (V::Sampler, true) => self.smp_srv.push(v),
                // the lab compares these two views; any other has no part in its report
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
        self.flows = seen.len();
    }
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
        // beyond-ack-timer: a low sampling rate, so the sampler misses most
        // immediate ACKs (the note's point); elsewhere every packet.
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

    /// Start a program (the bulk flow's iperf3) in the client namespace, stdout piped.
    fn spawn_cli(&self, tb: &Testbed, program: &str, args: &[String]) -> Result<Child> {
        let mut cmd = tb.command(Role::Cli, program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        pdeathsig(&mut cmd);
        cmd.spawn()
            .with_context(|| format!("starting {program} in {}", tb.ns(Role::Cli)))
    }
}

/// A child process (the bulk flow's iperf3) and the thread collecting its output.
struct Running {
    child: Child,
    out: std::thread::JoinHandle<(String, String)>,
}

fn collect(mut child: Child) -> Running {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        use std::io::Read;
        let mut a = String::new();
        let mut b = String::new();
        let h = std::thread::spawn(move || {
            let _ = se.read_to_string(&mut b);
            b
        });
        let _ = so.read_to_string(&mut a);
        (a, h.join().unwrap_or_default())
    });
    Running { child, out }
}

/// A probe running in this process, on a thread inside the client namespace (its sockets are
/// the client's): what identifies its packets (`ProbeResult::ident`) comes back with its result.
struct ProbeRun {
    what: String,
    cancel: tokio::sync::watch::Sender<bool>,
    handle: std::thread::JoinHandle<Result<crate::active::ProbeResult>>,
}

/// The probe's options as `rttscope probe` parses them (the lab's argument lists are the
/// command lines it records).
#[derive(clap::Parser)]
#[command(no_binary_name = true)]
struct ProbeLine {
    #[command(subcommand)]
    kind: crate::cmd::probe::ProbeKind,
}

/// The configuration of `rttscope probe tcp-rr|icmp ARGS` (`args[0]` is `probe`).
fn probe_config(args: &[String]) -> Result<crate::active::ProbeConfig> {
    use crate::cmd::probe::{ping_config, rr_config, ProbeKind};
    use clap::Parser;
    let line = ProbeLine::try_parse_from(args.iter().skip(1))
        .map_err(|e| anyhow!("the lab's probe arguments {args:?}: {e}"))?;
    match line.kind {
        ProbeKind::TcpRr { common, tcp } => rr_config(crate::active::Kind::TcpRr, &common, &tcp),
        ProbeKind::Icmp { ping } => ping_config(&ping),
        _ => bail!("the lab runs tcp-rr and icmp probes only: {args:?}"),
    }
}

/// Stop the probes (cancel) and wait for their threads.
fn cancel_all(kids: Vec<ProbeRun>) {
    for k in &kids {
        let _ = k.cancel.send(true);
    }
    for k in kids {
        let _ = k.handle.join();
    }
}

/// `rttscope probe tcp-rr` arguments: `req`/`resp` bytes every `interval` for `len` s.
fn rr_args(srv: &str, req: usize, resp: usize, interval: Duration, len: f64) -> Vec<String> {
    vec![
        "probe".into(),
        "tcp-rr".into(),
        srv.to_string(),
        "-p".into(),
        PORT.to_string(),
        "-l".into(),
        format!("{len:.3}"),
        "-w".into(),
        format!("{}us", interval.as_micros()),
        "-r".into(),
        format!("{req},{resp}"),
        "--nodelay".into(),
        // A transaction in TCP's exponential backoff (the loss
        // scenarios) is the application tail being measured, not a
        // failure: let it last as long as the phase (the probe's -l
        // ends it with the phase).
        "-W".into(),
        format!("{:.0}s", len.max(0.0) + 10.0),
        "--json".into(),
        "-".into(),
    ]
}

/// `rttscope probe icmp` arguments: one echo every `interval` for `len` s.
fn ping_args(srv: &str, interval: Duration, len: f64) -> Vec<String> {
    vec![
        "probe".into(),
        "icmp".into(),
        srv.to_string(),
        "-w".into(),
        format!("{len:.3}"),
        "-i".into(),
        format!("{}us", interval.as_micros()),
        "-W".into(),
        "5s".into(),
        "--json".into(),
        "-".into(),
    ]
}

/// `iperf3` arguments of the bulk download (server to client) for `secs` s.
fn bulk_args(srv: &str, secs: f64) -> Vec<String> {
    [
        "-c",
        srv,
        "-p",
        &BULK_PORT.to_string(),
        "-R",
        "-C",
        crate::lab::testbed::CONGESTION_CONTROL,
        "-t",
        &format!("{}", secs.ceil() as u64),
        "-J",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Waits for the probes, reporting progress and honouring Ctrl-C.
fn wait_for_probes(
    kids: &[ProbeRun],
    phase: &Phase,
    started: Instant,
    progress: &dyn Progress,
) -> Result<()> {
    loop {
        progress.at(started.elapsed().min(phase.duration));
        signals::check()?;
        if kids.iter().all(|k| k.handle.is_finished()) {
            break;
        }
        if started.elapsed() > phase.duration + Duration::from_secs(30) {
            bail!(
                "the probes of phase {} did not end 30 s after its length",
                phase.label
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Stops the bulk flow once iperf3 has printed its JSON (when its -t ends,
/// about now) and returns what the report says of it.
fn finish_bulk(mut b: Running) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && b.child.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = b.child.kill();
    let _ = b.child.wait();
    let (so, _) = b.out.join().unwrap_or_default();
    let v: Value = serde_json::from_str(so.trim()).unwrap_or(Value::Null);
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64();
    let cc = v["end"]["sender_tcp_congestion"].clone();
    Ok(
        json!({"tool": "iperf3 -R", "port": BULK_PORT, "received_bps": bps, "sender_congestion": cc}),
    )
}

impl LabEnv {
    /// Start iperf3 (the bulk flow) in the client namespace.
    fn spawn_bulk(&self, tb: &Testbed, a: Vec<String>) -> Result<Running> {
        Ok(collect(self.spawn_cli(tb, "iperf3", &a)?))
    }

    /// Start `rttscope probe ARGS` in this process, on a thread inside the client namespace.
    fn spawn_probe(&self, tb: &Testbed, what: &str, args: Vec<String>) -> Result<ProbeRun> {
        let cfg = probe_config(&args)?;
        let (cancel, rx) = crate::active::cancel::cancel_pair();
        let (path, name) = (tb.ns_path(Role::Cli), tb.ns(Role::Cli));
        let handle = std::thread::Builder::new()
            .name(format!("lab-{what}"))
            .spawn(move || {
                crate::sys::netns::enter_path(&path, &name)?;
                let rt = crate::active::cancel::runtime()?;
                rt.block_on(crate::active::run_probe(&cfg, rx))
            })
            .context("starting a probe thread")?;
        Ok(ProbeRun {
            what: what.into(),
            cancel,
            handle,
        })
    }

    /// Starts the phase's probes (and bulk flow) in the client namespace.
    fn start_workload(
        &self,
        tb: &Testbed,
        phase: &Phase,
        kids: &mut Vec<ProbeRun>,
        bulk: &mut Option<Running>,
    ) -> Result<()> {
        let secs = phase.duration.as_secs_f64();
        let srv = SRV_ADDR.to_string();
        match &phase.workload {
            Workload::TcpRr {
                request,
                response,
                interval,
                sessions,
            } => {
                for s in 0..*sessions {
                    // stagger parallel sessions over the interval
                    let a = rr_args(&srv, *request, *response, *interval, secs);
                    kids.push(self.spawn_probe(tb, &format!("rr{s}"), a)?);
                    if *sessions > 1 {
                        std::thread::sleep((*interval / *sessions).min(Duration::from_millis(50)));
                    }
                }
            }
            Workload::PingAndRr { interval } => {
                let a = rr_args(&srv, 1, 1, *interval, secs);
                kids.push(self.spawn_probe(tb, "rr", a)?);
                kids.push(self.spawn_probe(tb, "ping", ping_args(&srv, *interval, secs))?);
            }
            Workload::BulkWithProbes { probe_interval, .. } => {
                *bulk = Some(self.spawn_bulk(tb, bulk_args(&srv, secs))?);
                // let the bulk flow fill the queue before probing
                let warm = Duration::from_millis(1500).min(phase.duration / 4);
                std::thread::sleep(warm);
                let len = secs - warm.as_secs_f64();
                let a = rr_args(&srv, 1, 1, *probe_interval, len);
                kids.push(self.spawn_probe(tb, "rr", a)?);
                let a = ping_args(&srv, *probe_interval, len);
                kids.push(self.spawn_probe(tb, "ping", a)?);
            }
        }
        Ok(())
    }

    /// Unix seconds of a CLOCK_MONOTONIC time (ns).
    fn unix_of_mono(&self, ns: u64) -> f64 {
        (ns as i64 + self.realtime_minus_mono_ns) as f64 / 1e9
    }

    /// Reads one ended probe's result into the phase's samples (and a request/response probe's
    /// connection and window into the phase's own connections); returns its result without the
    /// samples, named by `probe`.
    fn probe_result(&mut self, k: ProbeRun, phase: &Phase) -> Result<Value> {
        let what = k.what;
        let p = k
            .handle
            .join()
            .map_err(|_| anyhow!("probe {what} in phase {} panicked", phase.label))?
            .with_context(|| format!("probe {what} in phase {} failed", phase.label))?;
        if p.counts.received == 0 && p.counts.sent > 0 {
            bail!(
                "probe {what} in phase {} had no replies from {} ({} sent{})",
                phase.label,
                p.settings.address,
                p.counts.sent,
                p.last_error
                    .as_ref()
                    .map(|e| format!(", last error: {e}"))
                    .unwrap_or_default()
            );
        }
        let t0 = p.ident.start_mono_ns;
        let samples: Vec<(f64, f64)> = p
            .samples
            .iter()
            .map(|&(t, rtt)| (self.unix_of_mono(t0 + t), rtt as f64 / 1e3))
            .collect();
        let lost = p.counts.lost + p.counts.errors;
        if what == "ping" {
            self.current.ping.extend(samples);
            self.current.ping_lost += lost;
        } else {
            self.current.rr.extend(samples);
            self.current.rr_failed += lost;
            if let Some(local) = p.ident.local {
                self.current.own.push(OwnFlow {
                    local: SocketAddr::new(local.ip().to_canonical(), local.port()),
                    start: self.unix_of_mono(p.ident.start_mono_ns),
                    end: self.unix_of_mono(p.ident.end_mono_ns),
                });
            }
        }
        let mut v = serde_json::to_value(&p)?;
        if let Some(o) = v.as_object_mut() {
            o.remove("samples");
            o.insert("probe".into(), json!(what));
            if let Some(local) = p.ident.local {
                o.insert("local".into(), json!(local.to_string()));
            }
        }
        Ok(v)
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
        let res = self
            .start_workload(tb, phase, &mut kids, &mut bulk)
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
            results.push(self.probe_result(k, phase)?);
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
        let v = json!({
            "observer": obs.args,
            "flows": d.flows,
            "left_out": d.left_out,
            "observer_dropped": d.observer_dropped,
            "tcp_client": summary_json(&d.tcp_cli),
            "tcp_server": summary_json(&d.tcp_srv),
            "sampler_client": summary_json(&d.smp_cli),
            "sampler_server": summary_json(&d.smp_srv),
            "counters_so_far": self.obs_counters,
        });
        self.data.push(std::mem::take(&mut self.current));
        Ok(v)
    }

    fn report(&mut self, plan: &Plan, records: &[PhaseRecord], out: &Path) -> Result<Vec<PathBuf>> {
        if let Some(mut o) = self.observer.take() {
            o.stop();
        }
        write_report(self, plan, records, out)
    }
}

// ---------------------------------------------------------------- statistics

/// The cloud metric's bucketed median (vm_flow/rtt layout) of RTTs in us.
pub fn cloud_p50_us(values: &[f64]) -> Option<f64> {
    use crate::analysis::dist::{vm_flow_preset, Distribution, ValueUnit};
    let mut d = Distribution::new(vm_flow_preset(), ValueUnit::Ms);
    for &x in values {
        d.add_us(x);
    }
    let p = d.percentile(50.0).ok()??;
    Some(ValueUnit::Ms.to_us(p.value))
}

fn rtts(s: &[(f64, f64)]) -> Vec<f64> {
    s.iter().map(|x| x.1).collect()
}

/// A view's phase statistics in the phase record: n, min, mean, p5, p50, p90, p95, p99, max
/// (us) from [`ViewSummary::of_samples`], the one exact summary (nearest-rank percentiles,
/// docs/results.md).
fn summary_json(s: &[(f64, f64)]) -> Value {
    let v = ViewSummary::of_samples("", None, &rtts(s));
    if v.count == 0 {
        return json!({"n": 0});
    }
    json!({
        "n": v.count, "min": v.min_us, "mean": v.mean_us, "p5": v.p5_us, "p50": v.p50_us,
        "p90": v.p90_us, "p95": v.p95_us, "p99": v.p99_us, "max": v.max_us,
    })
}

// ---------------------------------------------------------------- report

/// The views of a phase, in table order: (name, kind, side, samples).
type Series = Vec<(f64, f64)>;
type ViewRef<'a> = (&'static str, ViewKind, Option<&'static str>, &'a Series);

fn views_of(d: &PhaseData) -> Vec<ViewRef<'_>> {
    vec![
        ("rr", ViewKind::Probe, Some("client"), &d.rr),
        ("ping", ViewKind::Ping, Some("client"), &d.ping),
        ("tcp client", ViewKind::Tcp, Some("client"), &d.tcp_cli),
        ("tcp server", ViewKind::Tcp, Some("server"), &d.tcp_srv),
        (
            "sampler client",
            ViewKind::Sampler,
            Some("client"),
            &d.smp_cli,
        ),
        (
            "sampler server",
            ViewKind::Sampler,
            Some("server"),
            &d.smp_srv,
        ),
    ]
}

/// `--json FILE`: the document again, at FILE or on standard output (`-`, the rest of what lab
/// prints then goes to stderr).
fn write_json_copy(env: &LabEnv, rr: &RunResult) -> Result<()> {
    match env.json.as_deref() {
        None => Ok(()),
        Some(p) if p.as_os_str() == "-" => {
            let mut f = crate::analysis::results::stdout_for_document()?;
            std::io::Write::write_all(&mut f, rr.to_json()?.as_bytes())?;
            Ok(())
        }
        Some(p) => rr.save(p).map_err(|e| anyhow!("{e}")),
    }
}

/// A view's summary in the lab's result: the one exact summary, with p90 among the extras and
/// no stddev (as the lab's result always had them).
fn view_summary(name: &str, kind: ViewKind, s: &[(f64, f64)]) -> ViewSummary {
    let mut vs = ViewSummary::of_samples(name, Some(kind), &rtts(s));
    vs.stddev_us = None;
    if let Some(p90) = vs.p90_us.take() {
        vs.extra.insert("p90_us".into(), p90);
        if kind == ViewKind::Sampler {
            if let Some(c) = cloud_p50_us(&rtts(s)) {
                vs.extra.insert("cloud_p50_us".into(), c);
            }
        }
    }
    vs
}

/// The swept value of a phase as a number (labels that are not numbers: their index).
fn x_of(plan: &Plan, i: usize) -> f64 {
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

fn fmt_ms(us: Option<f64>) -> String {
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
fn swept_unit(plan: &Plan) -> &'static str {
    match plan.scenario {
        Scenario::Loss => "%",
        Scenario::Bufferbloat => "KiB queue, 0 = idle",
        Scenario::RttStep => "s",
        _ => "ms",
    }
}

/// Short column header of a view.
fn short(name: &str) -> &'static str {
    match name {
        "rr" => "RR",
        "ping" => "PING",
        "tcp client" => "TCP_CLI",
        "tcp server" => "TCP_SRV",
        "sampler client" => "SMP_CLI",
        "sampler server" => "SMP_SRV",
        _ => "?",
    }
}

fn build_table(plan: &Plan, points: &[Vec<ViewSummary>], with_p95: bool) -> Table {
    let has = |name: &str| {
        points
            .iter()
            .any(|p| p.iter().any(|v| v.view == name && v.count > 0))
    };
    let others: Vec<&str> = [
        "ping",
        "tcp client",
        "tcp server",
        "sampler client",
        "sampler server",
    ]
    .into_iter()
    .filter(|n| has(n))
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
/// views that saw samples (`others`).
fn table_head(plan: &Plan, others: &[&str], with_p95: bool) -> Vec<String> {
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
    for n in others {
        head.push(format!("{}_P50", short(n)));
        if with_p95 {
            head.push(format!("{}_P95", short(n)));
        }
    }
    for n in others.iter().filter(|n| n.starts_with("sampler")) {
        head.push(format!("{}_CLOUD_P50", short(n)));
    }
    // Units in the headers: every column but the swept value and the count is ms.
    for h in head.iter_mut().skip(1).filter(|h| !h.ends_with("_N")) {
        h.push_str(" ms");
    }
    head
}

/// One phase's row (`p`: its views' summaries), in [`table_head`]'s order.
fn table_row(label: &str, p: &[ViewSummary], others: &[&str], with_p95: bool) -> Vec<String> {
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
    for n in others {
        let v = get(n);
        r.push(fmt_ms(v.p50_us));
        if with_p95 {
            r.push(fmt_ms(v.p95_us));
        }
    }
    for n in others.iter().filter(|n| n.starts_with("sampler")) {
        r.push(fmt_ms(get(n).extra.get("cloud_p50_us").copied()));
    }
    r
}

fn p50(points: &[Vec<ViewSummary>], i: usize, view: &str) -> Option<f64> {
    points.get(i)?.iter().find(|v| v.view == view)?.p50_us
}

fn pct(points: &[Vec<ViewSummary>], i: usize, view: &str, q: u32) -> Option<f64> {
    let v = points.get(i)?.iter().find(|v| v.view == view)?;
    match q {
        5 => v.p5_us,
        50 => v.p50_us,
        95 => v.p95_us,
        99 => v.p99_us,
        _ => None,
    }
}

fn f(us: Option<f64>) -> String {
    format!("{} ms", fmt_ms(us))
}

fn range(points: &[Vec<ViewSummary>], view: &str) -> String {
    let v: Vec<f64> = (0..points.len())
        .filter_map(|i| p50(points, i, view))
        .collect();
    if v.is_empty() {
        return "- ms".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{}–{} ms", fmt_ms(Some(lo)), fmt_ms(Some(hi)))
}

fn idx(plan: &Plan, label: &str) -> Option<usize> {
    plan.phases.iter().position(|p| p.label == label)
}

/// 2–4 sentences on what the run showed, with its numbers.
fn observations(plan: &Plan, points: &[Vec<ViewSummary>], data: &[PhaseData]) -> Vec<String> {
    match plan.scenario {
        Scenario::DelayedAck => delayed_ack_observations(plan, points),
        Scenario::BeyondAckTimer => beyond_ack_timer_observations(plan, points, data),
        Scenario::RttStep => rtt_step_observations(plan, data),
        Scenario::Loss => loss_observations(plan, points),
        Scenario::Bufferbloat => bufferbloat_observations(plan, points, data),
        Scenario::ProbeInterval => probe_interval_observations(plan, points),
    }
}

/// The label of phase `i` (empty when there is none).
fn phase_label(plan: &Plan, i: usize) -> String {
    plan.phases
        .get(i)
        .map(|p| p.label.clone())
        .unwrap_or_default()
}

/// The sampler's cloud-bucket median of `view` at phase `i`.
fn cloud_p50(points: &[Vec<ViewSummary>], i: usize, view: &str) -> Option<f64> {
    points[i]
        .iter()
        .find(|v| v.view == view)
        .and_then(|v| v.extra.get("cloud_p50_us").copied())
}

fn delayed_ack_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    let last = points.len().saturating_sub(1);
    let mut s = Vec::new();
    let i16 = idx(plan, "16").unwrap_or(0);
    s.push(format!(
        "The server's TCP RTT (p50) followed the interval: {} at 0 ms, {} at 16 ms, {} at 32 ms — the client holds its ACK until the next request carries it.",
        f(p50(points, 0, "tcp server")),
        f(p50(points, i16, "tcp server")),
        f(idx(plan, "32").and_then(|i| p50(points, i, "tcp server"))),
    ));
    let s32 = idx(plan, "32").and_then(|i| p50(points, i, "tcp server"));
    let s41 = p50(points, last, "tcp server");
    s.push(format!(
        "At {} ms it was {}: {}.",
        phase_label(plan, last),
        f(s41),
        match (s41, s32) {
            (Some(a), Some(b)) if a < 0.5 * b => "the client's delayed-ACK timer (~40 ms) had fired and taken the socket out of ping-pong mode, so the client ACKed each response at once",
            _ => "capped near the client's delayed-ACK timer (~40 ms), whose ACK now comes before the next request",
        }
    ));
    s.push(format!(
        "The client's TCP RTT p50 stayed at {} and the request/response p50 at {} over all intervals: the server answers at once, so its ACK rides on the response.",
        range(points, "tcp client"),
        range(points, "rr"),
    ));
    s.push(format!(
        "The sampler agreed with TCP on each side: server {} at 16 ms (cloud-bucket median {}), client {} (cloud-bucket median {}).",
        f(p50(points, i16, "sampler server")),
        f(cloud_p50(points, i16, "sampler server")),
        f(p50(points, i16, "sampler client")),
        f(cloud_p50(points, i16, "sampler client")),
    ));
    s
}

fn beyond_ack_timer_observations(
    plan: &Plan,
    points: &[Vec<ViewSummary>],
    data: &[PhaseData],
) -> Vec<String> {
    let mut s = vec![format!(
        "TCP's RTT on the server stayed at {} (p50 per interval) and on the client at {}.",
        range(points, "tcp server"),
        range(points, "tcp client")
    )];
    for (i, d) in data.iter().enumerate().take(points.len()) {
        let x = plan.phases[i].label.parse::<f64>().unwrap_or(0.0) * 1e3;
        let smp: Vec<f64> = rtts(&d.smp_srv);
        let near = smp.iter().filter(|&&r| r > 0.5 * x).count();
        s.push(format!(
            "At {} ms the server-side sampler (1 in {} packets) took {} samples, {} of them above half the interval; its p50 {}, p95 {}.",
            phase_label(plan, i),
            4,
            smp.len(),
            near,
            f(p50(points, i, "sampler server")),
            f(pct(points, i, "sampler server", 95)),
        ));
    }
    s
}

fn rtt_step_observations(plan: &Plan, data: &[PhaseData]) -> Vec<String> {
    let d = &data[0];
    let half = plan.phases[0]
        .steps
        .first()
        .map(|s| s.at.as_secs_f64())
        .unwrap_or(0.0);
    let (lo, hi) = split_step(d, half);
    let mut s = Vec::new();
    for (name, v) in [
        ("RR", &d.rr),
        ("ping", &d.ping),
        ("TCP client", &d.tcp_cli),
        ("sampler client", &d.smp_cli),
    ] {
        let (a, b) = (med_in(v, d.start_unix, &lo), med_in(v, d.start_unix, &hi));
        s.push(format!(
            "{name}: p50 {} in the low halves, {} in the high halves (+{}).",
            f(a),
            f(b),
            f(b.zip(a).map(|(b, a)| b - a))
        ));
    }
    s
}

fn loss_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    (0..points.len())
        .map(|i| {
            format!(
                "At {} % loss: request/response p50 {} / p95 {}, TCP client p50 {} / p95 {}, TCP server p50 {} / p95 {}.",
                phase_label(plan, i),
                fmt_ms(pct(points, i, "rr", 50)),
                f(pct(points, i, "rr", 95)),
                fmt_ms(pct(points, i, "tcp client", 50)),
                f(pct(points, i, "tcp client", 95)),
                fmt_ms(pct(points, i, "tcp server", 50)),
                f(pct(points, i, "tcp server", 95)),
            )
        })
        .collect()
}

fn bufferbloat_observations(
    plan: &Plan,
    points: &[Vec<ViewSummary>],
    data: &[PhaseData],
) -> Vec<String> {
    let mut s = Vec::new();
    for (i, d) in data.iter().enumerate().take(points.len()) {
        let bw = d.bulk.as_ref().and_then(|b| b["received_bps"].as_f64());
        s.push(format!(
            "{}: RR p50 {}, ping p50 {}, TCP client p50 {}, sampler client p50 {}{}.",
            phase_label(plan, i),
            f(p50(points, i, "rr")),
            f(p50(points, i, "ping")),
            f(p50(points, i, "tcp client")),
            f(p50(points, i, "sampler client")),
            bw.map(|b| format!(", bulk {:.1} Mbit/s", b / 1e6))
                .unwrap_or_default()
        ));
    }
    s
}

fn probe_interval_observations(plan: &Plan, points: &[Vec<ViewSummary>]) -> Vec<String> {
    let last = points.len().saturating_sub(1);
    let mut s = Vec::new();
    if let (Some(b), Some(x)) = (p50(points, 0, "rr"), p50(points, last, "rr")) {
        s.push(format!(
            "Request/response p50 was {:.1} times higher with one probe every {} ms than back to back ({} vs {}).",
            x / b,
            phase_label(plan, last),
            f(Some(x)),
            f(Some(b))
        ));
    }
    for i in 0..points.len() {
        s.push(format!(
            "Interval {}: RR p50 {} (p99 {}), ping p50 {} (p99 {}), server TCP p50 {}.",
            phase_label(plan, i),
            f(p50(points, i, "rr")),
            f(pct(points, i, "rr", 99)),
            f(p50(points, i, "ping")),
            f(pct(points, i, "ping", 99)),
            f(p50(points, i, "tcp server")),
        ));
    }
    s
}

/// rtt-step: the low and high windows (s since phase start), skipping 1 s after each step.
fn split_step(d: &PhaseData, half: f64) -> (Series, Series) {
    let len = d.end_unix - d.start_unix;
    let mut lo = Vec::new();
    let mut hi = Vec::new();
    if half <= 0.0 {
        return (lo, hi);
    }
    let mut t = 0.0;
    let mut high = false;
    while t < len {
        let w = (t + 1.0, (t + half).min(len));
        if high {
            hi.push(w)
        } else {
            lo.push(w)
        }
        high = !high;
        t += half;
    }
    (lo, hi)
}

fn med_in(v: &[(f64, f64)], t0: f64, wins: &[(f64, f64)]) -> Option<f64> {
    let x: Vec<f64> = v
        .iter()
        .filter(|(t, _)| wins.iter().any(|w| t - t0 >= w.0 && t - t0 < w.1))
        .map(|s| s.1)
        .collect();
    ViewSummary::of_samples("", None, &x).p50_us
}

fn write_report(
    env: &LabEnv,
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
    let data = &env.data;
    let t0 = env.run_start_unix.unwrap_or(0.0);
    let points = phase_points(data);
    let settings = report_settings(env, plan, records, &name);
    let mut rr = RunResult::new(format!("lab {name}"), settings);
    rr.title = Some(format!(
        "lab {name}{}",
        if plan.quick { " (quick)" } else { "" }
    ));
    rr.start_unix_s = Some(t0);
    let sweep_kind = plan.phases.len() > 1;
    if sweep_kind {
        rr.sweep = Some(sweep_of(plan, &points, data));
    }
    push_sample_series(&mut rr, data, t0);
    let mut files = Vec::new();
    let p = out.join("result.json");
    rr.save(&p).map_err(|e| anyhow!("{e}"))?;
    files.push(p);
    write_json_copy(env, &rr)?;

    let table = build_table(
        plan,
        &points,
        matches!(plan.scenario, Scenario::Loss | Scenario::Bufferbloat),
    );
    let p = out.join("summary.csv");
    crate::sys::files::write_atomically(&p, table.csv().as_bytes())
        .with_context(|| format!("writing {}", p.display()))?;
    files.push(p);

    let charts = draw_charts(&rr, plan, sweep_kind, out);
    let obs = observations(plan, &points, data);
    let md = summary_markdown(env, plan, &name, t0, &table, &obs, &charts);
    let p = out.join("SUMMARY.md");
    crate::sys::files::write_atomically(&p, md.as_bytes())
        .with_context(|| format!("writing {}", p.display()))?;
    files.push(p);

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

/// Each phase's summary of every view.
fn phase_points(data: &[PhaseData]) -> Vec<Vec<ViewSummary>> {
    data.iter()
        .map(|d| {
            views_of(d)
                .into_iter()
                .map(|(n, k, _, s)| view_summary(n, k, s))
                .collect()
        })
        .collect()
}

/// The run's settings as result.json records them.
fn report_settings(env: &LabEnv, plan: &Plan, records: &[PhaseRecord], name: &str) -> Value {
    json!({
        "scenario": name,
        "quick": plan.quick,
        "swept": plan.swept,
        "expectation": plan.expectation,
        "phases": plan.phases,
        "responder": {"command": "rttscope serve", "port": PORT},
        "active": "rttscope probe tcp-rr --nodelay (and probe icmp where the workload pings); request/response sizes and interval per phase",
        "passive": {
            "observer": env.obs_args,
            "start": env.obs_start_line,
            "hooks": {"tcp": "cgroup sock_ops BPF_SOCK_OPS_RTT_CB on both ends", "sampler": format!("tc ingress+egress on {HOST_IF} of the client and of the server namespace")},
            "sample_every": env.sample_every,
            "counters": env.obs_counters,
            "unparsed_lines": env.obs_bad.0,
            "samples_of_other_flows": env.obs_bad.1,
            "selection": SELECTION,
            "left_out": left_out_total(&env.data),
        },
        "emulator": records.iter().map(|r| json!({"phase": r.phase.label, "impairment": r.impairment})).collect::<Vec<_>>(),
        "cloud_buckets": crate::analysis::dist::vm_flow_preset().spec(),
    })
}

/// How the lab's rows select the passive views' samples (result.json's settings).
const SELECTION: &str = "each phase's rows hold its own request/response connections only (the probe socket's address and the responder's: the 4-tuple), from each one's first transaction to the end of its last (the probe's CLOCK_MONOTONIC times, the kernel's sample times); every other sample on the lab's port is left out and counted (left_out)";

/// The samples left out over all phases.
fn left_out_total(data: &[PhaseData]) -> LeftOut {
    data.iter().fold(LeftOut::default(), |a, d| LeftOut {
        own_outside_window: a.own_outside_window + d.left_out.own_outside_window,
        other_connections: a.other_connections + d.left_out.other_connections,
    })
}

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
                settings: json!({"label": plan.phases[i].label, "workload": plan.phases[i].workload, "up": plan.phases[i].up, "down": plan.phases[i].down, "duration_ms": ms(plan.phases[i].duration), "flows": data[i].flows, "left_out": data[i].left_out, "observer_dropped": data[i].observer_dropped, "rr_failed": data[i].rr_failed, "ping_lost": data[i].ping_lost, "bulk": data[i].bulk}),
                views: v.iter().filter(|s| s.count > 0).cloned().collect(),
            })
            .collect(),
    }
}

/// The samples of every view over all phases as series (capped per view so
/// the file stays small).
fn push_sample_series(rr: &mut RunResult, data: &[PhaseData], t0: f64) {
    const CAP: usize = 20_000;
    for (vi, (n, k, side)) in [
        ("rr", ViewKind::Probe, "client"),
        ("ping", ViewKind::Ping, "client"),
        ("tcp client", ViewKind::Tcp, "client"),
        ("tcp server", ViewKind::Tcp, "server"),
        ("sampler client", ViewKind::Sampler, "client"),
        ("sampler server", ViewKind::Sampler, "server"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut all: Vec<(f64, f64)> = data
            .iter()
            .flat_map(|d| views_of(d)[vi].3.clone())
            .collect();
        if all.is_empty() {
            continue;
        }
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let step = all.len().div_ceil(CAP).max(1);
        let mut vs = ViewSeries::new(n, k);
        vs.side = Some(side.into());
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

/// SUMMARY.md: what was run and expected, the table, the observations and the files.
fn summary_markdown(
    env: &LabEnv,
    plan: &Plan,
    name: &str,
    t0: f64,
    table: &Table,
    obs: &[String],
    charts: &[PathBuf],
) -> String {
    let mut md = format!(
        "# lab {name}{}\n\n{}\n\nExpected: {}.\n\nRTTs in ms; RR = `rttscope probe tcp-rr` (request/response, per transaction), TCP = the TCP stack's RTT samples (sock_ops) on each end, SMP = the packet sampler at each end's interface{}, CLOUD_P50 = the sampler's median read from the vm_flow/rtt bucket layout.\n\n",
        if plan.quick { " (quick)" } else { "" },
        crate::analysis::results::rfc3339_utc(t0),
        plan.expectation,
        if env.sample_every > 1 { format!(" (1 in {} packets per direction)", env.sample_every) } else { String::new() },
    );
    md += &table.markdown();
    md += "\n";
    for o in obs {
        md += &format!("- {o}\n");
    }
    md += &format!("\n{}\n", left_out_sentence(&env.data));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let at = |v: &[f64]| v.iter().map(|&r| (0.0, r)).collect::<Vec<_>>();
        let v: Vec<f64> = (1..=101).map(|x| x as f64).collect();
        let s = view_summary("tcp client", ViewKind::Tcp, &at(&v));
        assert_eq!(s.count, 101);
        assert_eq!(s.p50_us, Some(51.0));
        assert_eq!(s.p5_us, Some(6.0));
        assert_eq!(s.p95_us, Some(96.0));
        assert_eq!(s.min_us, Some(1.0));
        assert_eq!(s.max_us, Some(101.0));
        assert!((s.mean_us.unwrap() - 51.0).abs() < 1e-9);
        assert_eq!(
            (s.p90_us, s.stddev_us, s.extra["p90_us"]),
            (None, None, 91.0)
        );
        let e = view_summary("tcp client", ViewKind::Tcp, &[]);
        assert_eq!((e.count, e.p50_us, e.extra.len()), (0, None, 0));
        assert_eq!(summary_json(&[]).to_string(), r#"{"n":0}"#);
        // An even count: an observed value (the lower middle one), never a mean of two.
        let j = summary_json(&at(&[10.0, 40.0, 20.0, 30.0])).to_string();
        assert_eq!(
            j,
            r#"{"max":40.0,"mean":25.0,"min":10.0,"n":4,"p5":10.0,"p50":20.0,"p90":40.0,"p95":40.0,"p99":40.0}"#
        );
    }

    /// The lab's p50 of a view is the statistic observe (and compare) report for the same
    /// samples: observe's result summarises a raw series with `ViewSummary::of_samples`, its
    /// tables with `Summary`.
    #[test]
    fn lab_and_observe_give_the_same_p50() {
        let samples: Vec<f64> = (0..1000)
            .map(|i| 40.0 + ((i * 7919) % 997) as f64 * 0.37)
            .collect();
        for n in [1, 2, 3, 4, 10, 101, 1000] {
            let v = &samples[..n];
            let lab = view_summary(
                "tcp client",
                ViewKind::Tcp,
                &v.iter().map(|&r| (0.0, r)).collect::<Vec<_>>(),
            );
            let observe = ViewSummary::of_samples("tcp client", Some(ViewKind::Tcp), v);
            let table = crate::analysis::stats::Summary::from_us(v);
            assert_eq!(lab.p50_us, observe.p50_us, "n={n}");
            assert_eq!(lab.p50_us, Some(table.p50), "n={n}");
            assert_eq!(
                (lab.p5_us, lab.p95_us, lab.p99_us),
                (observe.p5_us, observe.p95_us, observe.p99_us),
                "n={n}"
            );
            assert!(v.contains(&table.p50), "n={n}: p50 is an observed value");
        }
    }

    #[test]
    fn cloud_median_is_bucketed() {
        // 0.1 ms samples land in the 0..1 ms bucket: the bucketed median is within it, above the true median
        let c = cloud_p50_us(&[100.0; 50]).unwrap();
        assert!(c > 100.0 && c <= 1000.0, "{c}");
    }

    /// The session's raw samples as the observer reads them (t: seconds since its start, at
    /// Unix time 1000 and CLOCK_MONOTONIC 5 s).
    fn observed(lines: &[(&str, &str, &str, f64, f64)]) -> ObsShared {
        let mut s = ObsShared {
            start_ts: Some(1000.0),
            start_mono: 5_000_000_000,
            ..Default::default()
        };
        for (view, local, remote, t, rtt) in lines {
            let smp = crate::session::RawSample {
                view: match *view {
                    "tcp" => crate::views::ViewKind::Tcp,
                    _ => crate::views::ViewKind::Sampler,
                },
                event: crate::session::RawEvent::Rtt,
                flow: crate::analysis::flow::Flow {
                    netns: 1,
                    local: local.parse().unwrap(),
                    remote: remote.parse().unwrap(),
                },
                proto: None,
                side: crate::analysis::flow::Side::Unknown,
                ts_ns: 5_000_000_000 + (t * 1e9).round() as u64,
                rtt_us: *rtt as u32,
                srtt_us: None,
                matching: None,
            };
            super::super::observer::observed_sample(&mut s, &smp);
        }
        s
    }

    /// A phase takes exactly its own connection (by 4-tuple, both ends) inside its window;
    /// everything else on the lab's port is counted, by reason.
    #[test]
    fn a_phase_takes_its_own_connection_inside_its_window() {
        let cli = "10.79.1.2:40000";
        let srv = "10.79.2.2:7878";
        let mut s = observed(&[
            ("tcp", cli, srv, 0.5, 40.0),       // handshake: before the window
            ("tcp", cli, srv, 1.0, 50.0),       // client, first transaction
            ("tcp", srv, cli, 1.2, 9000.0),     // server
            ("sampler", cli, srv, 1.2, 45.0),   // sampler client
            ("sampler", srv, cli, 1.3, 9000.0), // sampler server
            ("tcp", cli, srv, 2.0, 50.0),       // client, last transaction's end
            ("tcp", srv, cli, 2.04, 40000.0),   // the last response's delayed ACK: after
            ("tcp", "10.79.1.2:39999", srv, 1.1, 30.0), // a connection open before the lab
            ("tcp", srv, "10.79.1.2:39999", 1.1, 30.0),
            ("tcp", "10.79.1.2:41000", srv, 9.0, 30.0), // another phase's connection, later
            ("sampler", "10.79.1.2:0", "10.79.2.2:0", 1.1, 30.0), // a ping: not the lab's port
            // IPv4-mapped IPv6 addresses name the same sockets: the server's, in the window
            (
                "tcp",
                "[::ffff:10.79.2.2]:7878",
                "[::ffff:10.79.1.2]:40000",
                1.5,
                9000.0,
            ),
        ]);
        assert_eq!(s.other_port, 1);
        let mut d = PhaseData {
            start_unix: 1000.2,
            own: vec![OwnFlow {
                local: "10.79.1.2:40000".parse().unwrap(),
                start: 1000.9,
                end: 1002.0,
            }],
            ..Default::default()
        };
        d.take_observed(&s, 1002.3);
        let n = |v: &Series| v.len();
        assert_eq!(
            (n(&d.tcp_cli), n(&d.tcp_srv), n(&d.smp_cli), n(&d.smp_srv)),
            (2, 2, 1, 1)
        );
        assert_eq!(d.flows, 1);
        assert_eq!(
            d.left_out,
            LeftOut {
                own_outside_window: 2,
                other_connections: 2
            }
        );
        // The kernel's time since the observer's start, on the Unix clock of its start.
        assert_eq!(d.tcp_cli[0], (1001.0, 50.0));
        assert_eq!(d.tcp_srv[1], (1001.5, 9000.0));
        // A flow's end is not a sample, and not counted.
        let kept = s.samples.len();
        let fin = crate::session::RawSample {
            event: crate::session::RawEvent::FlowEnd,
            rtt_us: 0,
            ts_ns: 6_000_000_000,
            flow: crate::analysis::flow::Flow {
                netns: 1,
                local: cli.parse().unwrap(),
                remote: srv.parse().unwrap(),
            },
            view: crate::views::ViewKind::Tcp,
            proto: None,
            side: crate::analysis::flow::Side::Client,
            srtt_us: None,
            matching: None,
        };
        super::super::observer::observed_sample(&mut s, &fin);
        assert_eq!((s.samples.len(), s.other_port), (kept, 1));
    }

    /// The lab runs the probes in-process with `rttscope probe`'s own parser and configuration.
    #[test]
    fn probe_arguments_parse_as_probe_does() {
        let c = probe_config(&rr_args("10.79.2.2", 1, 2, Duration::from_millis(10), 1.8)).unwrap();
        assert_eq!(c.kind, crate::active::Kind::TcpRr);
        assert_eq!((c.port, c.req_size, c.resp_size), (PORT, 1, 2));
        assert_eq!(c.interval, Duration::from_millis(10));
        assert!(c.nodelay);
        let c = probe_config(&ping_args("10.79.2.2", Duration::from_millis(100), 5.0)).unwrap();
        assert_eq!(c.kind, crate::active::Kind::Icmp);
        assert_eq!(c.interval, Duration::from_millis(100));
        assert!(probe_config(&["probe".into(), "udp-rr".into(), "x".into()]).is_err());
    }
}

/// The lab's report (result.json, summary.csv, SUMMARY.md) of every scenario for made-up
/// phase data is byte-identical to tests/fixtures/lab/report.txt (result.json without its
/// `created` time and `host`). Regenerate with RTTSCOPE_WRITE_GOLDEN=1; with
/// RTTSCOPE_LAB_REPORT_DIR=DIR the report files (charts too) are kept in DIR/<scenario>/.
#[cfg(test)]
mod report_golden {
    use super::*;

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
            tcp_cli: series(b * 0.8, 3),
            tcp_srv: series(b * 1.3, 4),
            smp_cli: series(b * 0.85, 5),
            smp_srv: series(b * 1.4, 6),
            rr_failed: i as u64,
            ping_lost: 2 * i as u64,
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
        write_report(&env, &plan, &[], &out).unwrap();
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
