//! The lab's passive views: observe's [`Session`], attached in this process
//! with the options of `rttscope observe --format json --netns <cli> --netns
//! <srv> --view <views> <their options> --port 7878 <their rates> --raw
//! --interval 500ms`, the views and their options from the registry (the
//! views with RTT samples of flows, [`crate::views::on_testbed`]; today
//! `--view tcp,sampler --iface <cli>:eth0 --iface <srv>:eth0 ... --sample-every N`),
//! parsed by observe's own parser into observe's own session configuration, from the host namespace, for the
//! whole run, read on a thread of its own as observe reads it: raw samples as
//! they arrive, an interval read every 500 ms (its counters, ring-buffer drops
//! among them), the whole-run summary's counters at the end. The samples of
//! the lab's port go into [`ObsShared`], where each phase selects its own
//! connections' (`PhaseData::take_observed`). The session is dropped (its
//! programs detached) on the thread when the run ends or fails.
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::sync::oneshot;

use super::env::PORT;
use crate::analysis::records;
use crate::cmd::observe::ObserveArgs;
use crate::lab::signals;
use crate::lab::testbed::{Role, Testbed, HOST_IF};
use crate::session::{RawEvent, RawSample, Session};
use crate::views::ViewKind;

/// One raw sample of the observer: unix time, RTT, and its connection as seen where it was
/// taken (local, remote).
#[derive(Debug, Clone, Copy)]
pub(super) struct ObsSample {
    pub view: ViewKind,
    pub t_unix: f64,
    pub rtt_us: f64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// What the observer's thread has read so far.
#[derive(Default)]
pub(super) struct ObsShared {
    /// The start record's `ts`: the Unix time of `start_mono` (t = 0).
    pub start_ts: Option<f64>,
    /// CLOCK_MONOTONIC (ns) at t = 0.
    pub start_mono: u64,
    pub start_line: Option<records::Start>,
    pub samples: Vec<ObsSample>,
    /// Each interval's (and the end's) reading of the observer's ring-buffer drops, both views:
    /// (Unix time, total so far).
    pub drops: Vec<(f64, u64)>,
    pub counters: Option<records::Counters>,
    /// Raw records the views could not decode (result.json's `unparsed_lines`).
    pub bad_records: u64,
    pub other_port: u64,
}

/// The session's thread, and how to stop it.
pub(super) struct Observer {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    pub shared: Arc<Mutex<ObsShared>>,
    /// observe's options the session was attached with (recorded in result.json).
    pub args: Vec<String>,
}

impl Observer {
    /// Attach the session on a thread of its own (from this thread's namespace, the host's);
    /// its notices and its error, if it fails, go to `log`.
    pub fn start(tb: &Testbed, sample_every: u32, log: PathBuf) -> Result<Observer> {
        let args = observer_args([&tb.ns(Role::Cli), &tb.ns(Role::Srv)], sample_every);
        let opts = observe_options(&args)?;
        let mut file = crate::sys::files::create_replacing(&log)
            .with_context(|| format!("creating {}", log.display()))?;
        let shared = Arc::new(Mutex::new(ObsShared::default()));
        let (stop, stop_rx) = oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("lab-observer".into())
            .spawn(move || {
                let r = observe(&opts, &sh, stop_rx, &mut file);
                if let Err(e) = &r {
                    let _ = writeln!(file, "rttscope: error: {e:#}");
                }
                r
            })
            .context("starting the observer's thread")?;
        let mut obs = Observer {
            stop: Some(stop),
            thread: Some(thread),
            shared,
            args,
        };
        obs.wait_started()?;
        Ok(obs)
    }

    /// Wait (up to 60 s) for the session to be attached.
    fn wait_started(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.shared.lock().unwrap().start_ts.is_some() {
                return Ok(());
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let e = self.ended();
                return Err(e.context("the observer did not start"));
            }
            if Instant::now() > deadline {
                bail!("the observer did not start within 60 s");
            }
            signals::check()?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why the observer's thread ended (it runs until stopped).
    fn ended(&mut self) -> anyhow::Error {
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            Some(Ok(Ok(()))) => anyhow!("it ended"),
            Some(Err(_)) => anyhow!("its thread panicked"),
            None => anyhow!("it was stopped"),
        }
    }

    /// An error when the observer has ended before the run.
    pub fn check_running(&mut self) -> Result<()> {
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            let e = self.ended();
            return Err(e.context("the observer stopped during the run"));
        }
        Ok(())
    }

    /// The first reading of the ring-buffer drops taken after `t` (Unix seconds), waiting up
    /// to `within` for it.
    pub fn drops_after(&self, t: f64, within: Duration) -> Result<Option<u64>> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(&(_, d)) = self.shared.lock().unwrap().drops.iter().find(|r| r.0 > t) {
                return Ok(Some(d));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            signals::check()?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The drops so far once the ring buffers accept every sample again: a back-to-back phase
    /// can overflow them, and they drop until the observer has caught up. Waits (up to 10 s)
    /// for a reading after `since` that dropped nothing since the one before it.
    pub fn settled(&self, since: f64) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut t = since;
        loop {
            let last = {
                let s = self.shared.lock().unwrap();
                let n = s.drops.len();
                (n >= 2 && s.drops[n - 1].0 > t).then(|| (s.drops[n - 2].1, s.drops[n - 1]))
            };
            if let Some((prev, (ts, now))) = last {
                if prev == now || Instant::now() > deadline {
                    return Ok(now);
                }
                t = ts;
            }
            signals::check()?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop the session's reads (a last interval read and the end's counters), wait (up to
    /// 10 s) for its thread, which drops the session: its programs are detached.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let Some(t) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if t.is_finished() {
            let _ = t.join(); // its error, if any, is in its log
        } else {
            eprintln!("rttscope: the observer did not stop within 10 s; its programs go when the lab exits");
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The passive views the lab runs and compares, in registry order: those whose samples are
/// RTTs of flows ([`ViewKind::flow_rtts`]).
pub(super) fn lab_kinds() -> impl Iterator<Item = ViewKind> {
    ViewKind::ALL.iter().copied().filter(|k| k.flow_rtts())
}

/// `rttscope observe`'s options for the whole run: the lab's views on both ends (`netns`: the
/// client's and the server's namespace), each attached as the registry says a view observes the
/// testbed ([`crate::views::on_testbed`]), raw samples of the flows to the responder's port.
fn observer_args(netns: [&str; 2], sample_every: u32) -> Vec<String> {
    let on: Vec<_> = lab_kinds()
        .map(|k| crate::views::on_testbed(k, netns, HOST_IF, sample_every))
        .collect();
    let names: Vec<&str> = lab_kinds().map(|k| k.as_str()).collect();
    let mut args: Vec<String> = ["observe", "--format", "json"]
        .into_iter()
        .map(String::from)
        .collect();
    for n in netns {
        args.extend(["--netns".to_string(), n.to_string()]);
    }
    args.extend(["--view".to_string(), names.join(",")]);
    args.extend(on.iter().flat_map(|o| o.attach.iter().cloned()));
    args.extend(["--port".to_string(), PORT.to_string()]);
    args.extend(on.iter().flat_map(|o| o.rate.iter().cloned()));
    args.extend(["--raw", "--interval", "500ms"].map(String::from));
    args
}

/// observe's options as its own parser reads `args` (`args[0]` is `observe`).
fn observe_options(args: &[String]) -> Result<ObserveArgs> {
    use clap::Parser;
    let cli = crate::cli::Cli::try_parse_from(
        std::iter::once("rttscope").chain(args.iter().map(|s| s.as_str())),
    )
    .map_err(|e| anyhow!("the lab's observer options {args:?}: {e}"))?;
    match cli.command {
        crate::cli::Command::Observe(a) => Ok(*a),
        _ => bail!("the lab's observer options are not observe's: {args:?}"),
    }
}

/// The observer's thread: attach observe's session, read it until stopped, then the
/// whole-run counters; the session is dropped here (inside its runtime).
fn observe(
    opts: &ObserveArgs,
    sh: &Mutex<ObsShared>,
    stop: oneshot::Receiver<()>,
    log: &mut File,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the observer's runtime")?;
    rt.block_on(async {
        let cfg = crate::cmd::observe::session_config(opts, &opts.views())?;
        let mut session = Session::attach(cfg)?;
        // t = 0 of the raw samples, and the start record's `ts` (its Unix time), as observe.
        let start_mono = crate::sys::clock::mono_ns();
        let start = crate::cmd::observe::start_record(opts, &session, start_mono)?;
        {
            let mut s = sh.lock().unwrap();
            (s.start_ts, s.start_mono) = (start.ts, start_mono);
            s.start_line = Some(start);
        }
        read_until_stopped(&mut session, sh, opts.interval, stop, log).await?;
        let end = records::counters(&session.summary()?.counters);
        let mut s = sh.lock().unwrap();
        s.drops.push((unix_now(), ring_drops(&end)));
        s.counters = Some(end);
        s.bad_records = session.raw_records_bad_total();
        Ok(())
    })
}

/// observe's loop without its output: raw samples as they arrive, an interval read every
/// `interval` (its counters and drops into `sh`), closed flows freed early when the TCP
/// view's table fills up; a last interval read when stopped (unless one was just taken).
async fn read_until_stopped(
    session: &mut Session,
    sh: &Mutex<ObsShared>,
    interval: Duration,
    mut stop: oneshot::Receiver<()>,
    log: &mut File,
) -> Result<()> {
    let mut reclaim_tick = tokio::time::interval((interval / 8).max(Duration::from_millis(50)));
    reclaim_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut read = Vec::new();
    let mut last_tick = Instant::now();
    loop {
        let stopping = tokio::select! {
            _ = ticker.tick() => false,
            r = session.next_raw(&mut read) => {
                r?;
                take_samples(sh, &mut read);
                continue;
            }
            _ = reclaim_tick.tick() => {
                session.between_reads(None)?;
                continue;
            }
            _ = &mut stop => true,
        };
        session.drain_raw(&mut read)?;
        take_samples(sh, &mut read);
        if stopping && last_tick.elapsed() < interval / 10 {
            break; // the last interval was just read
        }
        for n in session.check_vanished() {
            let _ = writeln!(log, "rttscope: notice: {n}");
        }
        let iv = session.read_interval(None)?.interval;
        last_tick = Instant::now();
        let mut s = sh.lock().unwrap();
        s.drops.push((unix_now(), ring_drops(&iv.counters)));
        s.counters = Some(iv.counters);
        s.bad_records = session.raw_records_bad_total();
        if stopping {
            break;
        }
    }
    Ok(())
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The samples read into the shared state (`read` is emptied).
fn take_samples(sh: &Mutex<ObsShared>, read: &mut Vec<RawSample>) {
    if read.is_empty() {
        return;
    }
    let mut s = sh.lock().unwrap();
    for smp in read.drain(..) {
        observed_sample(&mut s, &smp);
    }
}

/// The samples the observer's ring buffers dropped so far (both views; a full ring buffer drops
/// and counts what does not fit until the observer has read it empty).
pub(super) fn ring_drops(c: &records::Counters) -> u64 {
    c.values()
        .flat_map(|m| m.iter())
        .filter(|(k, _)| k.as_ref() == "raw_events_dropped" || k.as_ref() == "raw_drops")
        .map(|(_, v)| *v)
        .sum()
}

/// One raw RTT sample of the session: kept if it is one of a connection to or from the lab's
/// port (the phases select their own connections from them; an IPv4-mapped IPv6 address as its
/// IPv4 one); anything else is counted, a flow's end is not a sample. Its Unix time is the
/// start's (`start_ts`) plus its kernel time since t = 0, as observe's raw records give it.
pub(super) fn observed_sample(s: &mut ObsShared, smp: &RawSample) {
    if smp.event != RawEvent::Rtt {
        return;
    }
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (local, remote) = (canonical(smp.flow.local), canonical(smp.flow.remote));
    if local.port() != PORT && remote.port() != PORT {
        s.other_port += 1;
        return;
    }
    let t = (smp.ts_ns as i64 - s.start_mono as i64) as f64 / 1e9;
    let t_unix = s.start_ts.unwrap_or(0.0) + t;
    s.samples.push(ObsSample {
        view: smp.view,
        t_unix,
        rtt_us: smp.rtt_us as f64,
        local,
        remote,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drops are read from the interval and end records' counters, both views' names.
    #[test]
    fn ring_drops_of_both_views() {
        let l = r#"{"type":"interval","t":1.0,"ts":1000.0,"interval_s":0.5,"flows":[],"totals":{},"counters":{"tcp":{"raw_events_dropped":5,"samples":9},"sampler":{"raw_drops":2,"raw_events_dropped":1}}}"#;
        let Ok(records::Record::Interval(iv)) = records::Record::parse(l) else {
            panic!("{l}")
        };
        assert_eq!(ring_drops(&iv.counters), 8);
    }

    /// The observer's options from the registry: the views with RTT samples of flows, each with
    /// its options for the testbed, in the order the lab has always recorded them.
    #[test]
    fn observer_args_from_the_registry() {
        let want = [
            "observe",
            "--format",
            "json",
            "--netns",
            "rtlab-c",
            "--netns",
            "rtlab-s",
            "--view",
            "tcp,sampler",
            "--iface",
            "rtlab-c:eth0",
            "--iface",
            "rtlab-s:eth0",
            "--port",
            "7878",
            "--sample-every",
            "4",
            "--raw",
            "--interval",
            "500ms",
        ];
        assert_eq!(observer_args(["rtlab-c", "rtlab-s"], 4), want);
        let o = observe_options(&observer_args(["a", "b"], 1)).unwrap();
        assert_eq!(o.views(), vec![ViewKind::Tcp, ViewKind::Sampler]);
        assert_eq!(o.view_opts.sampler.sample_every, 1);
    }

    /// The lab's observer options parse as observe's: the settings the child observer had.
    #[test]
    fn observer_options_parse_as_observe_does() {
        let args: Vec<String> = [
            "observe",
            "--format",
            "json",
            "--netns",
            "a",
            "--netns",
            "b",
            "--view",
            "tcp,sampler",
            "--iface",
            "a:eth0",
            "--iface",
            "b:eth0",
            "--port",
            "7878",
            "--sample-every",
            "4",
            "--raw",
            "--interval",
            "500ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let o = observe_options(&args).unwrap();
        assert_eq!(o.views(), vec![ViewKind::Tcp, ViewKind::Sampler]);
        assert_eq!(
            (o.ports.clone(), o.interval),
            (vec![PORT], Duration::from_millis(500))
        );
        assert_eq!(o.netns, vec!["a", "b"]);
        assert!(o.raw);
        assert_eq!(o.view_opts.sampler.sample_every, 4);
        let bad = ["observe".to_string(), "--interval".into(), "fast".into()];
        assert!(observe_options(&bad).is_err());
        assert!(observe_options(&["probe".into(), "icmp".into(), "x".into()]).is_err());
    }
}
