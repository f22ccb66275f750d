//! The probes' wiring: `rttscope probe`'s probes in this process on threads inside the client
//! namespace, the bulk flow's iperf3 as a child, and their results read into the phase's data.
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::phase::{OwnFlow, PhaseData};
use super::{BULK_PORT, PORT};
use crate::lab::scenarios::{Phase, Progress, Workload};
use crate::lab::signals;
use crate::lab::testbed::{Role, Testbed, SRV_ADDR};

fn pdeathsig(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Start a program (the bulk flow's iperf3) in the client namespace, stdout piped.
fn spawn_cli(tb: &Testbed, program: &str, args: &[String]) -> Result<Child> {
    let mut cmd = tb.command(Role::Cli, program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    pdeathsig(&mut cmd);
    cmd.spawn()
        .with_context(|| format!("starting {program} in {}", tb.ns(Role::Cli)))
}

/// A child process (the bulk flow's iperf3) and the thread collecting its output.
pub(super) struct Running {
    pub(super) child: Child,
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
pub(super) struct ProbeRun {
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
    use crate::cmd::probe::{connect_config, ping_config, rr_config, ProbeKind};
    use clap::Parser;
    let line = ProbeLine::try_parse_from(args.iter().skip(1))
        .map_err(|e| anyhow!("the lab's probe arguments {args:?}: {e}"))?;
    match line.kind {
        ProbeKind::TcpRr { common, tcp } => rr_config(crate::active::Kind::TcpRr, &common, &tcp),
        ProbeKind::Icmp { ping } => ping_config(&ping),
        ProbeKind::TcpConnect { opts } => connect_config(&opts),
        _ => bail!("the lab runs tcp-rr, icmp and tcp-connect probes only: {args:?}"),
    }
}

/// Stop the probes (cancel) and wait for their threads.
pub(super) fn cancel_all(kids: Vec<ProbeRun>) {
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

/// `rttscope probe tcp-connect` arguments: one handshake with the lab's responder every
/// `interval` (at least 10 ms: each handshake holds a client port in TIME_WAIT for 60 s, as
/// compare's) for `len` s, beside ping: the path's RTT where ICMP would be denied.
fn connect_args(srv: &str, interval: Duration, len: f64) -> Vec<String> {
    vec![
        "probe".into(),
        "tcp-connect".into(),
        format!("{srv}:{PORT}"),
        "-w".into(),
        format!("{len:.3}"),
        "-i".into(),
        format!("{}us", interval.max(Duration::from_millis(10)).as_micros()),
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
pub(super) fn wait_for_probes(
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
pub(super) fn finish_bulk(mut b: Running) -> Result<Value> {
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

/// Start iperf3 (the bulk flow) in the client namespace.
fn spawn_bulk(tb: &Testbed, a: Vec<String>) -> Result<Running> {
    Ok(collect(spawn_cli(tb, "iperf3", &a)?))
}

/// Start `rttscope probe ARGS` in this process, on a thread inside the client namespace.
fn spawn_probe(tb: &Testbed, what: &str, args: Vec<String>) -> Result<ProbeRun> {
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
pub(super) fn start_workload(
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
                kids.push(spawn_probe(tb, &format!("rr{s}"), a)?);
                if *sessions > 1 {
                    std::thread::sleep((*interval / *sessions).min(Duration::from_millis(50)));
                }
            }
        }
        Workload::PingAndRr { interval } => {
            let a = rr_args(&srv, 1, 1, *interval, secs);
            kids.push(spawn_probe(tb, "rr", a)?);
            kids.push(spawn_probe(tb, "ping", ping_args(&srv, *interval, secs))?);
            let a = connect_args(&srv, *interval, secs);
            kids.push(spawn_probe(tb, "connect", a)?);
        }
        Workload::BulkWithProbes { probe_interval, .. } => {
            *bulk = Some(spawn_bulk(tb, bulk_args(&srv, secs))?);
            // let the bulk flow fill the queue before probing
            let warm = Duration::from_millis(1500).min(phase.duration / 4);
            std::thread::sleep(warm);
            let len = secs - warm.as_secs_f64();
            let a = rr_args(&srv, 1, 1, *probe_interval, len);
            kids.push(spawn_probe(tb, "rr", a)?);
            let a = ping_args(&srv, *probe_interval, len);
            kids.push(spawn_probe(tb, "ping", a)?);
            let a = connect_args(&srv, *probe_interval, len);
            kids.push(spawn_probe(tb, "connect", a)?);
        }
    }
    Ok(())
}

/// Unix seconds of a CLOCK_MONOTONIC time (ns).
fn unix_of_mono(ns: u64, realtime_minus_mono_ns: i64) -> f64 {
    (ns as i64 + realtime_minus_mono_ns) as f64 / 1e9
}

/// Reads one ended probe's result into the phase's samples (and a request/response probe's
/// connection and window into the phase's own connections); returns its result without the
/// samples, named by `probe`. `realtime_minus_mono_ns`: CLOCK_REALTIME - CLOCK_MONOTONIC (ns).
pub(super) fn probe_result(
    k: ProbeRun,
    phase: &Phase,
    current: &mut PhaseData,
    realtime_minus_mono_ns: i64,
) -> Result<Value> {
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
        .map(|&(t, rtt)| {
            (
                unix_of_mono(t0 + t, realtime_minus_mono_ns),
                rtt as f64 / 1e3,
            )
        })
        .collect();
    let lost = p.counts.lost + p.counts.errors;
    if what == "ping" {
        current.ping.extend(samples);
        current.ping_lost += lost;
    } else if what == "connect" {
        current.connect.extend(samples);
        current.connect_failed += lost;
    } else {
        current.rr.extend(samples);
        current.rr_failed += lost;
        if let Some(local) = p.ident.local {
            current.own.push(OwnFlow {
                local: SocketAddr::new(local.ip().to_canonical(), local.port()),
                start: unix_of_mono(p.ident.start_mono_ns, realtime_minus_mono_ns),
                end: unix_of_mono(p.ident.end_mono_ns, realtime_minus_mono_ns),
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

#[cfg(test)]
mod tests {
    use super::*;

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
