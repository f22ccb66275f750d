//! The window: the probes run concurrently while the passive views' raw samples are read
//! through the session as they arrive.
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::active::rr::{run_probe, ProbeConfig, ProbeResult};
use crate::analysis::flow::Side;
use crate::session::{RawEvent, RawSample, Session};

/// The passive views' raw samples as they arrive (read through the session), with the
/// kernel's monotonic time (the probes' windows select them afterwards): RTT samples of
/// TCP flows, and the sampler's ICMP echo samples where this host is the pinger (issue 17).
pub(super) struct Collected {
    /// When the reading started (CLOCK_MONOTONIC ns and Unix seconds).
    pub(super) start_mono: u64,
    pub(super) start_unix: f64,
    pub(super) samples: Vec<RawSample>,
    read: Vec<RawSample>,
}

impl Collected {
    pub(super) fn new() -> Self {
        let start_mono = crate::sys::clock::mono_ns();
        let start_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Collected {
            start_mono,
            start_unix,
            samples: Vec::new(),
            read: Vec::new(),
        }
    }

    /// Take every sample available now, without waiting.
    fn drain(&mut self, session: &mut Session) -> Result<()> {
        session.drain_raw(&mut self.read)?;
        self.samples.extend(
            self.read.drain(..).filter(|s| {
                s.event == RawEvent::Rtt && (s.proto.is_none() || s.side == Side::Pinger)
            }),
        );
        Ok(())
    }
}

pub(super) type RrResults = Vec<Result<ProbeResult>>;
pub(super) type IrttOutcome = Option<Result<crate::active::irtt::IrttResult>>;

/// Run the probes concurrently over the same window while collecting the
/// passive views' raw samples; Ctrl-C or SIGTERM ends the probes early.
pub(super) async fn run_window(
    rr: &[ProbeConfig],
    irtt: Option<&crate::active::irtt::IrttConfig>,
    session: &mut Session,
    raw: &mut Collected,
) -> Result<(RrResults, IrttOutcome)> {
    let (cancel_tx, cancel_rx) = crate::active::cancel::cancel_pair();
    let irtt_stop = Arc::new(AtomicBool::new(false));
    // Every probe over the same window: irtt beside the others, not after them.
    let probes = async {
        let rr = futures_join_all(rr.iter().map(|c| run_probe(c, cancel_rx.clone())).collect());
        let ir = async {
            match irtt.cloned() {
                Some(c) => Some(crate::active::irtt::run_irtt(c, irtt_stop.clone()).await),
                None => None,
            }
        };
        tokio::join!(rr, ir)
    };
    tokio::pin!(probes);
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = || {
        let _ = cancel_tx.send(true);
        irtt_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    let out = loop {
        tokio::select! {
            r = &mut probes => break r,
            _ = poll.tick() => raw.drain(session)?,
            _ = tokio::signal::ctrl_c() => stop(),
            _ = sigterm.recv() => stop(),
        }
    };
    // Late samples of the last transactions.
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.drain(session)?;
    Ok(out)
}

/// Drive every future concurrently on this task; outputs in input order.
async fn futures_join_all<F: std::future::Future>(fs: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<std::pin::Pin<Box<F>>>> =
        fs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, out) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *out = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results
        .into_iter()
        .map(|r| r.expect("every future completed"))
        .collect()
}
