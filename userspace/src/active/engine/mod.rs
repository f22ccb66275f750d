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

/// Run transactions until `plan.stop` or the pacer's signal; returns the end
/// of the last transaction (CLOCK_MONOTONIC). `rec.start` is the run's start.
pub(crate) async fn run<T: Transport>(
    t: &mut T,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    plan: &Plan,
) -> Result<u64> {
    rec.start = mono_ns();
    let end = match transactions(t, pacer, rec, plan).await? {
        Some(stopped) => stopped,
        None => {
            let end = mono_ns();
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

/// The paced transactions. Some(end): stopped mid-transaction, which does not count.
async fn transactions<T: Transport>(
    t: &mut T,
    pacer: &mut Pacer,
    rec: &mut Recorder,
    plan: &Plan,
) -> Result<Option<u64>> {
    let stop = StopAt::new(plan.stop, rec.start);
    let mut seq = 0u64;
    while !stop.done(rec.counts.sent, pacer.next_start()) && pacer.wait().await? {
        seq += 1;
        if plan.yield_often && seq.is_multiple_of(256) {
            tokio::task::yield_now().await;
        }
        if let Some(end) = transaction(t, rec, seq).await? {
            return Ok(Some(end));
        }
    }
    Ok(None)
}

/// One transaction: send request `seq`, receive until it is answered, lost or
/// failed. Some(end): the run was stopped meanwhile; the run's window ends when this uncounted
/// request left (or now, if it never did), so that the passive views' samples of it (its
/// request and response crossed the wire while the probe stopped) are not taken as the last
/// counted transaction's.
async fn transaction<T: Transport>(t: &mut T, rec: &mut Recorder, seq: u64) -> Result<Option<u64>> {
    const NEXT: Result<Option<u64>> = Ok(None);
    rec.pending(seq);
    let mut sent = match t.send(seq).await? {
        Sent::At(s) => s,
        Sent::Failed(e) => return rec.failed(seq, "send", &e, true).and(NEXT),
        Sent::Stopped => return Ok(Some(mono_ns())),
    };
    let mut resent = false;
    loop {
        match t.recv().await? {
            Event::Reply(r, t1) => {
                if rec.reply(seq, sent, r, t1) == Verdict::Answered {
                    return NEXT;
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
                    Sent::Failed(e) => return rec.failed(seq, "send", &e, false).and(NEXT),
                    Sent::Stopped => return Ok(Some(sent.mono_ns)),
                }
            }
            Event::TimedOut => {
                rec.timed_out(seq);
                return NEXT;
            }
            Event::Failed(e) => {
                rec.failed(seq, "receive", &e, true)?;
                t.pause().await;
                return NEXT;
            }
            Event::IcmpError(e) => {
                // The request waiting now, if the error quotes it (an older one's is counted).
                let ours = e.seq16 == seq as u16;
                rec.icmp_error(ours.then_some(seq), &e);
                if ours {
                    return NEXT;
                }
            }
            Event::Stopped => return Ok(Some(sent.mono_ns)),
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
