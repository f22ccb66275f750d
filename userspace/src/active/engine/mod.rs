//! The probe engine: one loop for every request/response transport (TCP in
//! the reactor or on a blocking thread, UDP, ICMP echo), after trippy's
//! `Strategy::run`. The loop sends what is due when the [`Pacer`] says so,
//! receives until the request is answered or times out, and tells the
//! [`Recorder`] what happened; the transports only move bytes and stamps.
//! The unit tests below drive it with a scripted transport (late, duplicate,
//! reordered, lost and failed replies); the real transports are tested over
//! real sockets (`rr.rs`, `serve/tests.rs`) and namespaces (tests/tests/active.rs).
pub(crate) mod io;
pub(crate) mod pacer;
pub(crate) mod recorder;

use std::time::Duration;

use anyhow::Result;

use crate::active::config::Stop;
use crate::sys::clock::mono_ns;
pub(crate) use io::{Event, Reply, Sent, Stamp, Transport};
pub(crate) use pacer::{Pacer, Signal};
pub(crate) use recorder::{Recorder, Verdict};

/// How a run proceeds.
pub(crate) struct Plan {
    pub stop: Stop,
    /// Yield to the runtime every 256 transactions (`--spin`, `--busy-poll` in the reactor).
    pub yield_often: bool,
    /// How long to collect stragglers after the last transaction.
    pub grace: Duration,
}

/// Run transactions until `plan.stop` or the pacer's signal; returns the run's window end
/// (CLOCK_MONOTONIC): when its last counted transaction ended (its reply read, or its timeout or
/// failure), or when a stopped one's request left. Nothing of the run's own crosses the wire
/// between that end and the last counted reply, so passive views' samples inside the window
/// are the counted transactions' (the lab counts them). `rec.start` is the run's start.
pub(crate) async fn run<T: Transport>(
    t: &mut T,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    plan: &Plan,
) -> Result<u64> {
    rec.start = mono_ns();
    let end = match transactions(t, pacer, rec, plan).await? {
        Ended::Stopped(end) => end,
        Ended::Done(end) => {
            let until = tokio::time::Instant::now() + plan.grace;
            while let Some(r) = t.straggler(until).await {
                rec.straggler(r.seq);
            }
            end
        }
    };
    rec.counts.foreign += t.foreign();
    Ok(end)
}

/// How a transaction, or the run, ended (CLOCK_MONOTONIC).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    /// Counted (answered, lost or failed): its reply's time, or when it was given up.
    Done(u64),
    /// Stopped meanwhile: it does not count, and the run's window ends here.
    Stopped(u64),
}

/// The paced transactions; how the last one ended (a run with none: `Done(rec.start)`).
async fn transactions<T: Transport>(
    t: &mut T,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    plan: &Plan,
) -> Result<Ended> {
    let stop = StopAt::new(plan.stop, rec.start);
    let (mut seq, mut last) = (0u64, rec.start);
    while !stop.done(rec.counts.sent, pacer.next_start()) && pacer.wait().await? {
        seq += 1;
        if plan.yield_often && seq.is_multiple_of(256) {
            tokio::task::yield_now().await;
        }
        match transaction(t, rec, seq, last).await? {
            Ended::Done(end) => last = end,
            stopped => return Ok(stopped),
        }
    }
    Ok(Ended::Done(last))
}

/// One transaction: send request `seq`, receive until it is answered, lost or failed. Stopped
/// meanwhile, it does not count and the run's window ends when its request left, so that the
/// passive views' samples of it (its request and response crossed the wire while the probe
/// stopped) are not taken as the last counted transaction's; stopped before its request left,
/// the window ends with the previous one (`last`): the stop's own packets (the watchdog's FIN)
/// may already be on the wire.
async fn transaction<T: Transport>(
    t: &mut T,
    rec: &mut Recorder,
    seq: u64,
    last: u64,
) -> Result<Ended> {
    let given_up = || Ok(Ended::Done(mono_ns()));
    rec.pending(seq);
    let mut sent = match t.send(seq).await? {
        Sent::At(s) => s,
        Sent::Failed(e) => return rec.failed(seq, "send", &e, true).and_then(|_| given_up()),
        Sent::Stopped => return Ok(Ended::Stopped(last)),
    };
    let mut resent = false;
    loop {
        match t.recv().await? {
            Event::Reply(r, t1) => {
                if rec.reply(seq, sent, r, t1) == Verdict::Answered {
                    return Ok(Ended::Done(t1));
                }
            }
            Event::Foreign => rec.counts.foreign += 1,
            Event::Resend if resent => rec.counts.foreign += 1,
            Event::Resend => {
                // Send this request once more, and time the transaction from there.
                resent = true;
                rec.counts.cookie_refreshes += 1;
                match t.send(seq).await? {
                    Sent::At(s) => sent = s,
                    Sent::Failed(e) => {
                        return rec.failed(seq, "send", &e, false).and_then(|_| given_up())
                    }
                    Sent::Stopped => return Ok(Ended::Stopped(sent.mono_ns)),
                }
            }
            Event::TimedOut => {
                rec.timed_out(seq);
                return given_up();
            }
            Event::Failed(e) => {
                rec.failed(seq, "receive", &e, true)?;
                let end = mono_ns();
                t.pause().await;
                return Ok(Ended::Done(end));
            }
            Event::IcmpError(e) => {
                // The request waiting now, if the error quotes it (an older one's is counted).
                let ours = e.seq16 == seq as u16;
                rec.icmp_error(ours.then_some(seq), &e);
                if ours {
                    return given_up();
                }
            }
            Event::Stopped => return Ok(Ended::Stopped(sent.mono_ns)),
        }
    }
}

/// When a run ends.
pub(crate) struct StopAt {
    stop: Stop,
    pub end: u64,
}

impl StopAt {
    pub fn new(stop: Stop, start: u64) -> Self {
        let end = match stop {
            Stop::Duration(d) | Stop::CountOrDuration(_, d) => {
                start.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64)
            }
            Stop::Count(_) => u64::MAX,
        };
        StopAt { stop, end }
    }
    /// Done when the count is reached, or when the next transaction would start at or after the end.
    pub fn done(&self, sent: u64, next_start: u64) -> bool {
        let late = || mono_ns().max(next_start) >= self.end;
        match self.stop {
            Stop::Count(n) => sent >= n,
            Stop::Duration(_) => late(),
            Stop::CountOrDuration(n, _) => sent >= n || late(),
        }
    }
}

/// Run a future whose awaits never wait (a blocking thread's transport and
/// pacer block in their system calls instead) to completion on this thread.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests;
