//! The engine's counting through a scripted transport, as trippy tests its
//! probe loop with a simulated network: no sockets, no runtime, exact counts.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;
use crate::active::config::ReplyHook;

/// What the scripted network does with request `seq`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// Answered within the timeout, after `rtt` ns.
    Answer,
    /// Answered twice: the second copy arrives after the first.
    Twice,
    /// Answered after the next `n` requests were sent (after its timeout).
    Late(u64),
    /// Never answered.
    Never,
    /// The send fails.
    SendFails,
    /// The receive fails.
    RecvFails,
    /// The responder asks for it again `n` times: once, then it answers; more, then never.
    Resend(u32),
    /// The run is cancelled while it waits.
    Stopped,
    /// The run is cancelled before the request leaves (the send finds the socket shut down).
    StoppedBeforeSend,
}

/// A network whose every request meets the fate `script` gives it. Replies sit
/// on the wire until the transaction they are due in; `recv` hands out those due,
/// oldest first, then the current request's fate decides (timeout, error, stop).
struct Scripted {
    script: Box<dyn Fn(u64) -> Fate>,
    /// (due in transaction, reply) in arrival order.
    wire: Vec<(u64, Reply)>,
    seq: u64,
    sent_at: BTreeMap<u64, u64>,
    /// How often the responder asked for the current request again.
    asked: u32,
    /// Datagrams that are not replies to us, handed out once before the first request's reply.
    noise: u32,
}

const RTT: u64 = 250_000;

impl Scripted {
    fn new(script: impl Fn(u64) -> Fate + 'static) -> Self {
        Scripted {
            script: Box::new(script),
            wire: Vec::new(),
            seq: 0,
            sent_at: BTreeMap::new(),
            asked: 0,
            noise: 0,
        }
    }
    fn put(&mut self, due: u64, seq: u64) {
        self.wire.push((
            due,
            Reply {
                seq,
                rx_real_ns: None,
                ttl: None,
            },
        ));
    }
}

impl Transport for Scripted {
    async fn send(&mut self, seq: u64) -> Result<Sent> {
        let fate = (self.script)(seq);
        if fate == Fate::SendFails {
            return Ok(Sent::Failed(std::io::Error::other("no route")));
        }
        if fate == Fate::StoppedBeforeSend {
            return Ok(Sent::Stopped);
        }
        if self.seq != seq {
            self.asked = 0;
        }
        self.seq = seq;
        let now = mono_ns();
        self.sent_at.insert(seq, now);
        match fate {
            Fate::Answer => self.put(seq, seq),
            Fate::Twice => {
                self.put(seq, seq);
                self.put(seq, seq);
            }
            Fate::Late(n) => self.put(seq + n, seq),
            Fate::Resend(1) if self.asked == 1 => self.put(seq, seq),
            _ => {}
        }
        Ok(Sent::At(Stamp {
            mono_ns: now,
            real_ns: None,
        }))
    }

    async fn recv(&mut self) -> Result<Event> {
        if self.noise > 0 {
            self.noise -= 1;
            return Ok(Event::Foreign);
        }
        if let Some(i) = self.wire.iter().position(|(due, _)| *due <= self.seq) {
            let (_, r) = self.wire.remove(i);
            return Ok(Event::Reply(
                r,
                self.sent_at.get(&r.seq).map_or(0, |t| t + RTT),
            ));
        }
        Ok(match (self.script)(self.seq) {
            Fate::RecvFails => Event::Failed(std::io::Error::other("refused")),
            Fate::Resend(n) if self.asked < n => {
                self.asked += 1;
                Event::Resend
            }
            Fate::Stopped => Event::Stopped,
            _ => Event::TimedOut,
        })
    }

    async fn straggler(&mut self, _until: tokio::time::Instant) -> Option<Reply> {
        (!self.wire.is_empty()).then(|| self.wire.remove(0).1)
    }
}

/// Run `n` transactions back to back through `t`; the replies the hook saw.
fn run_n(t: &mut Scripted, n: u64) -> (Result<u64>, Recorder, Vec<u64>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let hook = ReplyHook::new(move |seq, rtt| {
        assert_eq!(rtt, RTT);
        s2.lock().unwrap().push(seq);
    });
    let mut rec = Recorder::new(1_000, Some(hook));
    let signal = Signal::Flag(Default::default());
    let mut pacer = Pacer::new(Duration::ZERO, 1, false, signal).unwrap();
    let plan = Plan {
        stop: Stop::Count(n),
        yield_often: false,
        grace: Duration::from_millis(10),
    };
    let r = block_on(run(t, &mut pacer, &mut rec, &plan));
    let seen = seen.lock().unwrap().clone();
    (r, rec, seen)
}

#[test]
fn late_duplicate_reordered_and_lost_are_counted_exactly() {
    // Every 5th answered twice, every 7th answered 3 requests late, every 11th never.
    let fate = |s: u64| match s {
        s if s % 11 == 0 => Fate::Never,
        s if s % 7 == 0 => Fate::Late(3),
        s if s % 5 == 0 => Fate::Twice,
        _ => Fate::Answer,
    };
    let mut t = Scripted::new(fate);
    t.noise = 2;
    let (r, rec, seen) = run_n(&mut t, 40);
    r.unwrap();
    let k = &rec.counts;
    let all = 1..=40u64;
    let count = |f: Fate| all.clone().filter(|s| fate(*s) == f).count() as u64;
    let (never, late, twice) = (count(Fate::Never), count(Fate::Late(3)), count(Fate::Twice));
    assert_eq!((never, late, twice), (3, 5, 7));
    assert_eq!(k.sent, 40, "{k:?}");
    assert_eq!(k.lost, never + late, "{k:?}");
    assert_eq!(k.received, 40 - never - late, "{k:?}");
    assert_eq!(k.late, late, "{k:?}");
    // Each late reply arrives when a newer request has been answered.
    assert_eq!(k.reordered, late, "{k:?}");
    // The 40th's second copy comes after the run: collected as a straggler.
    assert_eq!(k.duplicates, twice, "{k:?}");
    assert_eq!(k.foreign, 2, "{k:?}");
    assert_eq!((k.errors, k.cookie_refreshes), (0, 0), "{k:?}");
    assert_eq!(rec.samples.len() as u64, k.received);
    assert!(rec.samples.iter().all(|s| s.1 == RTT));
    // The hook saw each answered request once, by its own sequence number, in order.
    let answered: Vec<u64> = all
        .filter(|s| matches!(fate(*s), Fate::Answer | Fate::Twice))
        .collect();
    assert_eq!(seen, answered);
}

#[test]
fn a_late_reply_older_than_the_newest_answer_is_reordered_only_then() {
    // 2 is answered during 3 (after 3 was sent, before 3's own reply): late, and
    // not reordered (1 is the newest answered); 5 is answered after 6: reordered.
    let fate = |s: u64| match s {
        2 => Fate::Late(1),
        5 => Fate::Late(2),
        _ => Fate::Answer,
    };
    let mut t = Scripted::new(fate);
    let (r, rec, _) = run_n(&mut t, 8);
    r.unwrap();
    let k = &rec.counts;
    assert_eq!(
        (k.sent, k.received, k.lost, k.late, k.reordered),
        (8, 6, 2, 2, 1),
        "{k:?}"
    );
}

#[test]
fn send_and_receive_errors_are_lost_requests_and_a_hundred_in_a_row_end_the_run() {
    let fate = |s: u64| match s % 4 {
        1 => Fate::SendFails,
        2 => Fate::RecvFails,
        _ => Fate::Answer,
    };
    let mut t = Scripted::new(fate);
    let (r, rec, _) = run_n(&mut t, 8);
    r.unwrap();
    let k = &rec.counts;
    assert_eq!(
        (k.sent, k.received, k.lost, k.errors),
        (8, 4, 4, 4),
        "{k:?}"
    );
    assert_eq!(rec.last_error.as_deref(), Some("receive: refused"));
    // An answer resets the errors in a row: 99 failures, an answer, 99 failures pass.
    let mut t = Scripted::new(|s| {
        if s == 100 {
            Fate::Answer
        } else {
            Fate::SendFails
        }
    });
    let (r, rec, _) = run_n(&mut t, 199);
    r.unwrap();
    assert_eq!(rec.counts.errors, 198);
    let mut t = Scripted::new(|_| Fate::SendFails);
    let (r, rec, _) = run_n(&mut t, 1000);
    let e = r.unwrap_err().to_string();
    assert_eq!(e, "100 send errors in a row, last: no route");
    assert_eq!(rec.counts.sent, 100);
}

#[test]
fn a_resend_request_is_sent_again_once_and_timed_from_there() {
    let mut t = Scripted::new(|s| {
        if s == 2 {
            Fate::Resend(1)
        } else {
            Fate::Answer
        }
    });
    let (r, rec, seen) = run_n(&mut t, 3);
    r.unwrap();
    let k = &rec.counts;
    assert_eq!(
        (k.sent, k.received, k.cookie_refreshes, k.foreign),
        (3, 3, 1, 0),
        "{k:?}"
    );
    assert_eq!(seen, vec![1, 2, 3]);
    // A second request for the same transaction is not honoured (foreign); it times out.
    let mut t = Scripted::new(|s| {
        if s == 1 {
            Fate::Resend(2)
        } else {
            Fate::Answer
        }
    });
    let (r, rec, _) = run_n(&mut t, 2);
    r.unwrap();
    let k = &rec.counts;
    assert_eq!(
        (k.sent, k.received, k.lost, k.cookie_refreshes, k.foreign),
        (2, 1, 1, 1, 1),
        "{k:?}"
    );
}

#[test]
fn a_stopped_transaction_does_not_count_and_ends_the_run() {
    let mut t = Scripted::new(|s| if s == 4 { Fate::Stopped } else { Fate::Answer });
    let (r, rec, _) = run_n(&mut t, 10);
    let end = r.unwrap();
    let k = &rec.counts;
    assert_eq!((k.sent, k.received, k.lost), (3, 3, 0), "{k:?}");
    // the window ends when the uncounted request left: its packets are not the last counted
    // transaction's
    assert_eq!(Some(&end), t.sent_at.get(&4), "{:?}", t.sent_at);
    assert!(end > t.sent_at[&3]);
}

/// The window ends with the last counted reply (its `t1`), not when the loop noticed the end:
/// a stop's packets (the watchdog's FIN) after that reply are outside it.
#[test]
fn the_window_ends_with_the_last_counted_reply() {
    let mut t = Scripted::new(|_| Fate::Answer);
    let (r, rec, _) = run_n(&mut t, 5);
    assert_eq!(rec.counts.received, 5);
    assert_eq!(r.unwrap(), t.sent_at[&5] + RTT, "{:?}", t.sent_at);
}

/// Stopped before its request left (the send found the socket shut down, so the stop's FIN is
/// already on the wire): the window ends with the previous transaction's reply.
#[test]
fn a_stop_before_the_send_ends_the_window_with_the_previous_reply() {
    let mut t = Scripted::new(|s| {
        if s == 3 {
            Fate::StoppedBeforeSend
        } else {
            Fate::Answer
        }
    });
    let (r, rec, _) = run_n(&mut t, 10);
    let k = &rec.counts;
    assert_eq!((k.received, k.lost), (2, 0), "{k:?}");
    assert_eq!(r.unwrap(), t.sent_at[&2] + RTT, "{:?}", t.sent_at);
}

#[test]
fn replies_outside_the_window_or_never_sent_are_foreign() {
    let mut t = Scripted::new(|_| Fate::Answer);
    // A reply for a request never sent (the window's slot holds another number).
    t.put(0, 5 + recorder::WINDOW as u64);
    let (r, rec, _) = run_n(&mut t, 5);
    r.unwrap();
    assert_eq!(
        (rec.counts.received, rec.counts.foreign),
        (5, 1),
        "{:?}",
        rec.counts
    );
}

#[test]
fn kernel_stamps_time_icmp_and_their_absence_falls_back_to_userspace() {
    let mut rec = Recorder::new(10, None);
    rec.start = 1_000;
    let sent = Stamp {
        mono_ns: 2_000,
        real_ns: Some(5_000_000),
    };
    rec.pending(1);
    let r = Reply {
        seq: 1,
        rx_real_ns: Some(5_000_000 + 40_000),
        ttl: None,
    };
    assert_eq!(rec.reply(1, sent, r, 2_000 + 60_000), Verdict::Answered);
    assert_eq!(rec.samples, vec![(1_000, 40_000)]);
    rec.pending(2);
    let r = Reply {
        seq: 2,
        rx_real_ns: None,
        ttl: None,
    };
    assert_eq!(rec.reply(2, sent, r, 2_000 + 70_000), Verdict::Answered);
    assert_eq!(rec.samples[1], (1_000, 70_000));
    assert_eq!(rec.counts.rx_timestamp_fallbacks, 1);
}
