//! The recorder: what became of every request (answered, timed out, failed,
//! answered late or twice), the samples of the answered ones, and the counts.
//! It knows nothing of sockets or clocks: the engine tells it what happened.
use anyhow::{bail, Result};

use super::io::{Reply, Stamp};
use crate::active::config::{LineHook, ProbeLine, ReplyHook};
use crate::active::result::Counts;
use crate::analysis::stats::{HdrRecorder, NetperfHist};

/// State of the last `WINDOW` sequence numbers, for late/duplicate accounting.
pub(crate) const WINDOW: usize = 4096;

/// Errors in a row (send or receive) that end a datagram run.
const MAX_CONSECUTIVE_ERRORS: u32 = 100;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SeqState {
    Unknown,
    Pending,
    Answered,
    TimedOut,
}

/// What a reply was, for the request it names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Verdict {
    /// The reply the pending request waited for: sampled.
    Answered,
    /// Anything else (late, duplicate, unknown): counted, the request still waits.
    Other,
}

/// The last `WINDOW` requests by sequence number, and the newest answered one.
pub(crate) struct SeqWindow {
    states: Vec<(u64, SeqState)>,
    newest_answered: Option<u64>,
}

impl SeqWindow {
    fn new() -> Self {
        SeqWindow {
            states: vec![(u64::MAX, SeqState::Unknown); WINDOW],
            newest_answered: None,
        }
    }
    fn slot(&mut self, seq: u64) -> &mut (u64, SeqState) {
        &mut self.states[(seq as usize) % WINDOW]
    }
    fn timed_out(&mut self, seq: u64) {
        self.slot(seq).1 = SeqState::TimedOut;
    }
}

/// Counts, samples and histograms of one run.
pub(crate) struct Recorder {
    /// CLOCK_MONOTONIC of the run's start: sample offsets are from here.
    pub start: u64,
    pub counts: Counts,
    pub samples: Vec<(u64, u64)>,
    pub hdr: HdrRecorder,
    pub np: NetperfHist,
    pub last_error: Option<String>,
    on_reply: Option<ReplyHook>,
    /// ping's (ICMP) or tcping's (`tcp-connect`) line per request.
    pub on_line: Option<LineHook>,
    max_samples: usize,
    window: SeqWindow,
    consecutive_errors: u32,
}

impl Recorder {
    pub fn new(max_samples: usize, on_reply: Option<ReplyHook>) -> Self {
        Recorder {
            start: 0,
            counts: Counts::default(),
            samples: Vec::with_capacity(max_samples.min(1 << 16)),
            hdr: HdrRecorder::new(),
            np: NetperfHist::new(),
            last_error: None,
            on_reply,
            on_line: None,
            max_samples,
            window: SeqWindow::new(),
            consecutive_errors: 0,
        }
    }

    /// Request `seq` is about to be sent.
    pub fn pending(&mut self, seq: u64) {
        *self.window.slot(seq) = (seq, SeqState::Pending);
    }

    /// Request `seq` got no reply within the timeout: lost (a reply may still come, late).
    pub fn timed_out(&mut self, seq: u64) {
        self.lost(seq);
        self.line(ProbeLine::TimedOut { seq });
    }

    /// Request `seq` is lost (timed out, failed, or answered by an ICMP error).
    fn lost(&mut self, seq: u64) {
        self.counts.sent += 1;
        self.counts.lost += 1;
        self.window.timed_out(seq);
    }

    /// Tell the line hook, if there is one.
    fn line(&self, l: ProbeLine) {
        if let Some(h) = &self.on_line {
            (h.0)(&l);
        }
    }

    /// Request `seq` could not be sent, or its receive failed: an error, and lost.
    /// `in_a_row` counts it towards the errors in a row that end the run.
    pub fn failed(
        &mut self,
        seq: u64,
        what: &str,
        e: &std::io::Error,
        in_a_row: bool,
    ) -> Result<()> {
        self.error(format!("{what}: {e}"));
        self.lost(seq);
        self.line(ProbeLine::Failed {
            seq,
            text: e.to_string(),
        });
        if in_a_row {
            self.consecutive_errors += 1;
            if self.consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                bail!("{MAX_CONSECUTIVE_ERRORS} {what} errors in a row, last: {e}");
            }
        }
        Ok(())
    }

    /// A reply naming `got` arrived at `t1` while request `seq`, sent at `sent`, waits.
    pub fn reply(&mut self, seq: u64, sent: Stamp, reply: Reply, t1: u64) -> Verdict {
        let got = reply.seq;
        let slot = self.window.slot(got);
        if slot.0 != got {
            // Older than the window, or never sent.
            self.counts.foreign += 1;
            return Verdict::Other;
        }
        match slot.1 {
            SeqState::Pending => {
                debug_assert_eq!(got, seq);
                slot.1 = SeqState::Answered;
                self.consecutive_errors = 0;
                self.counts.sent += 1;
                self.answered(got, sent, reply, t1);
                self.window.newest_answered = Some(got);
                return Verdict::Answered;
            }
            SeqState::Unknown => self.counts.foreign += 1,
            _ => self.late_or_duplicate(got),
        }
        Verdict::Other
    }

    /// A reply that arrived after the last transaction (stragglers): late or duplicate.
    pub fn straggler(&mut self, got: u64) {
        let slot = self.window.slot(got);
        if slot.0 == got && matches!(slot.1, SeqState::Answered | SeqState::TimedOut) {
            self.late_or_duplicate(got);
        }
    }

    fn late_or_duplicate(&mut self, got: u64) {
        let slot = self.window.slot(got);
        match slot.1 {
            SeqState::Answered => self.counts.duplicates += 1,
            SeqState::TimedOut => {
                slot.1 = SeqState::Answered;
                self.counts.late += 1;
                if self.window.newest_answered.is_some_and(|n| got < n) {
                    self.counts.reordered += 1;
                }
            }
            SeqState::Pending | SeqState::Unknown => {}
        }
    }

    /// The RTT of an answered request: userspace times (TCP_RR, UDP_RR: netperf), or the
    /// kernel's receive time against the realtime send stamp (ICMP: ping).
    fn answered(&mut self, seq: u64, sent: Stamp, reply: Reply, t1: u64) {
        let t0 = sent.mono_ns;
        let user = t1.saturating_sub(t0);
        let rtt = match sent.real_ns {
            None => user,
            Some(sent_real) => match reply
                .rx_real_ns
                .and_then(|rx| crate::active::icmp::kernel_rtt(sent_real, rx, t1 - t0))
            {
                Some(rtt) => rtt,
                None => {
                    self.counts.rx_timestamp_fallbacks += 1;
                    user
                }
            },
        };
        self.sample(seq, t0, rtt);
        self.line(ProbeLine::Reply {
            seq,
            rtt_ns: rtt,
            ttl: reply.ttl,
        });
    }

    /// A sample sent at `t0` (CLOCK_MONOTONIC) with its RTT.
    fn sample(&mut self, seq: u64, t0: u64, rtt: u64) {
        self.counts.received += 1;
        if let Some(h) = &self.on_reply {
            (h.0)(seq, rtt);
        }
        self.hdr.record_ns(rtt);
        self.np.record_ns(rtt);
        if self.samples.len() < self.max_samples {
            self.samples.push((t0 - self.start, rtt));
        } else {
            self.counts.samples_dropped += 1;
        }
    }

    /// ICMP: an error about request `seq` (None: an older request's, already done): counted in
    /// `errors` and, for the waiting request, lost; ping's line through the ICMP hook. It does
    /// not end the run (ping goes on through unreachables).
    pub fn icmp_error(&mut self, seq: Option<u64>, e: &crate::active::icmp::IcmpError) {
        self.error(format!("from {}: {}", e.from, e.text));
        if let Some(seq) = seq {
            self.lost(seq);
        }
        self.line(ProbeLine::Error {
            seq: seq.unwrap_or(e.seq16.into()),
            from: e.from,
            text: e.text.clone(),
        });
    }

    pub fn error(&mut self, e: impl std::fmt::Display) {
        self.counts.errors += 1;
        self.last_error = Some(e.to_string());
    }
}
