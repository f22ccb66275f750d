//! The sending side of OTLP: a thread with a runtime of its own, fed
//! through a bounded queue by the observe loop, which never waits for it.
//!
//! Every request carries cumulative counts, so a newer one supersedes every
//! older one. Requests are sent in order; a retryable failure (connection,
//! TLS, timeout, 429/502/503/504) is retried after an exponential backoff
//! with jitter (at least what `Retry-After` asked), and when a newer request
//! is waiting by then, that one is sent instead. Every request pushed ends
//! as delivered (`rttscope_otlp_exports_total`) or dropped
//! (`rttscope_otlp_dropped_total{reason}`): `queue_full`, `superseded`,
//! `refused` (an answer not worth a retry: 400, 401, ...), `exit` (the last
//! one, not delivered within the exit deadline).
//!
//! At exit ([`Pusher::finish`]) only the last state is sent: what is queued
//! or in flight is superseded, and the last request gets what is left of
//! [`EXIT_DEADLINE`], whatever the receiver does.
use std::collections::{HashSet, VecDeque};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use hyper::body::Bytes;

use super::client::{Client, Failure};
use super::settings::Settings;
use super::stats::Stats;

/// Requests waiting to be sent, at most; the oldest is dropped past that.
pub const QUEUE: usize = 4;
/// At exit, the last request is delivered within this time or dropped.
pub const EXIT_DEADLINE: Duration = Duration::from_millis(1500);
/// The first wait after a failure; doubled after each failure in a row.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two attempts (without a longer Retry-After).
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The longest Retry-After honoured.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);

/// Failures in a row, and the wait before the next attempt.
#[derive(Debug, Default, Clone)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// After one more failure: [`BACKOFF_FIRST`] doubled per failure in a
    /// row up to [`BACKOFF_MAX`], times `jitter` in [0.5, 1] (`random`: a
    /// uniform draw in [0, 1), so that a fleet does not retry in step); at
    /// least `retry_after`, up to [`RETRY_AFTER_MAX`].
    pub fn next(&mut self, retry_after: Option<Duration>, random: f64) -> Duration {
        let doubled = BACKOFF_FIRST.saturating_mul(1u32 << self.failures.min(16));
        self.failures = self.failures.saturating_add(1);
        let wait = doubled
            .min(BACKOFF_MAX)
            .mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0));
        match retry_after {
            Some(r) => wait.max(r.min(RETRY_AFTER_MAX)),
            None => wait,
        }
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The exit: the last request and when it must be done.
struct Stop {
    last: Option<Vec<u8>>,
    deadline: Instant,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Vec<u8>>,
    stop: Option<Stop>,
    /// What became of the last request (None: delivered).
    last_failed: Option<String>,
}

/// What the observe loop and the sending thread share.
struct Shared {
    queue: Mutex<Queue>,
    /// A request was queued.
    wake: tokio::sync::Notify,
    /// Exit asked.
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending side: a thread with its own runtime, fed through a bounded queue.
pub struct Pusher {
    shared: Arc<Shared>,
    stats: Stats,
    thread: Option<(std::thread::JoinHandle<()>, mpsc::Receiver<()>)>,
}

impl Pusher {
    /// Read the TLS files (an error now, not at the first push) and start the thread.
    pub fn start(settings: &Settings, stats: Stats) -> Result<Pusher> {
        let client = Client::new(settings)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
            stopping: tokio::sync::watch::channel(false).0,
        });
        let (sh, st) = (shared.clone(), stats.clone());
        let shown = settings.endpoint.shown();
        let (done, finished) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rttscope-otlp".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        let mut s = Sender::new(client, sh, st, shown);
                        rt.block_on(s.run());
                        // a name lookup still running is left behind
                        rt.shutdown_background();
                    }
                    Err(_) => st.failed("runtime"),
                }
                let _ = done.send(());
            })?;
        Ok(Pusher {
            shared,
            stats,
            thread: Some((thread, finished)),
        })
    }

    /// Queue one encoded request; never waits (drops the oldest when full).
    pub fn push(&self, body: Vec<u8>) {
        let mut q = self.shared.lock();
        if q.stop.is_some() {
            return;
        }
        if q.items.len() >= QUEUE {
            q.items.pop_front();
            self.stats.dropped("queue_full");
        }
        q.items.push_back(body);
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Exit: drop what is queued or in flight (superseded), send `last`
    /// within [`EXIT_DEADLINE`], stop the thread. Returns None when the last
    /// request was delivered, else why not. Waits at most the deadline and a
    /// little more, whatever the receiver and the name lookups do.
    pub fn finish(&mut self, last: Option<Vec<u8>>) -> Option<String> {
        let (thread, finished) = self.thread.take()?;
        let deadline = Instant::now() + EXIT_DEADLINE;
        {
            let mut q = self.shared.lock();
            for _ in q.items.drain(..) {
                self.stats.dropped("superseded");
            }
            q.stop = Some(Stop { last, deadline });
        }
        self.shared.stopping.send_replace(true);
        self.shared.wake.notify_one();
        let grace = Duration::from_millis(300);
        match finished.recv_timeout(EXIT_DEADLINE + grace) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                self.shared.lock().last_failed.take()
            }
            // the thread is left behind: the process is exiting
            Err(mpsc::RecvTimeoutError::Timeout) => Some(format!(
                "the sender did not stop within {:?}",
                EXIT_DEADLINE + grace
            )),
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.finish(None);
    }
}

/// The thread's side.
struct Sender {
    client: Client,
    shared: Arc<Shared>,
    stats: Stats,
    stop: tokio::sync::watch::Receiver<bool>,
    backoff: Backoff,
    said: HashSet<String>,
    shown: String,
}

impl Sender {
    fn new(client: Client, shared: Arc<Shared>, stats: Stats, shown: String) -> Sender {
        Sender {
            client,
            stop: shared.stopping.subscribe(),
            shared,
            stats,
            backoff: Backoff::default(),
            said: HashSet::new(),
            shown,
        }
    }

    /// Send in order until the exit, then the last request.
    async fn run(&mut self) {
        if self.send_until_exit().await {
            // what was in flight or waiting for a retry: superseded by the last
            self.stats.dropped("superseded");
        }
        self.last().await;
    }

    /// Until exit is asked; true when a request was in flight or waiting
    /// for a retry then.
    async fn send_until_exit(&mut self) -> bool {
        let mut retry: Option<Bytes> = None;
        loop {
            let body = match retry.take() {
                Some(b) => b,
                None => match self.next().await {
                    Some(b) => self.client.encode(b),
                    None => return false,
                },
            };
            let mut stop = self.stop.clone();
            let r = tokio::select! {
                r = self.client.post(&body) => r,
                _ = stop.wait_for(|s| *s) => return true,
            };
            let Err(f) = r else {
                self.stats.sent.inc();
                self.backoff.reset();
                continue;
            };
            self.failed(&f);
            if !f.retryable {
                self.stats.dropped("refused");
                continue;
            }
            let wait = self.backoff.next(f.retry_after, rand::random());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return true,
            }
            retry = Some(match self.newest() {
                Some(newer) => {
                    self.stats.dropped("superseded");
                    self.client.encode(newer)
                }
                None => body,
            });
        }
    }

    /// The next queued request; None once exit is asked.
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            {
                let mut q = self.shared.lock();
                if q.stop.is_some() {
                    return None;
                }
                if let Some(b) = q.items.pop_front() {
                    return Some(b);
                }
            }
            let mut stop = self.stop.clone();
            tokio::select! {
                _ = self.shared.wake.notified() => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    }

    /// The newest queued request, the older ones dropped (superseded).
    fn newest(&self) -> Option<Vec<u8>> {
        let mut q = self.shared.lock();
        let newest = q.items.pop_back();
        for _ in q.items.drain(..) {
            self.stats.dropped("superseded");
        }
        newest
    }

    /// Exit: the last request, once, within what is left of the deadline.
    async fn last(&mut self) {
        let (last, deadline) = match self.shared.lock().stop.as_mut() {
            Some(s) => (s.last.take(), s.deadline),
            None => return,
        };
        let Some(last) = last else { return };
        let body = self.client.encode(last);
        let left = deadline.saturating_duration_since(Instant::now());
        let r = match tokio::time::timeout(left, self.client.post(&body)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::retryable(
                "timeout",
                format!("no answer within the exit deadline ({EXIT_DEADLINE:?})"),
            )),
        };
        match r {
            Ok(()) => {
                self.stats.sent.inc();
            }
            Err(f) => {
                self.stats.failed(&f.cause);
                self.stats.dropped("exit");
                self.shared.lock().last_failed = Some(format!("{} ({})", f.why, f.cause));
            }
        }
    }

    /// Count a failure; say it once per cause.
    fn failed(&mut self, f: &Failure) {
        self.stats.failed(&f.cause);
        if self.said.insert(f.cause.clone()) {
            let then = match f.retryable {
                true => "retried with backoff",
                false => "dropped",
            };
            eprintln!(
                "rttscope: OTLP export to {} failed ({}): {}; {then} (counted in rttscope_otlp_failures_total; said once per cause)",
                self.shown, f.cause, f.why
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::otlp::settings::Given;

    #[test]
    fn backoff_doubles_within_bounds_and_honours_retry_after() {
        let mut b = Backoff::default();
        let mut lows = Vec::new();
        for i in 0..40 {
            let cap = BACKOFF_FIRST
                .saturating_mul(1 << i.min(16))
                .min(BACKOFF_MAX);
            let mut probe = b.clone();
            let lo = probe.next(None, 0.0);
            let hi = b.next(None, 0.999_999);
            assert!(lo >= cap / 2 && lo <= cap, "{i}: {lo:?} of {cap:?}");
            assert!(
                hi <= cap && hi > cap.mul_f64(0.99),
                "{i}: {hi:?} of {cap:?}"
            );
            lows.push(lo);
        }
        assert_eq!(lows[0], BACKOFF_FIRST / 2);
        assert_eq!(*lows.last().unwrap(), BACKOFF_MAX / 2);
        let mut b = Backoff::default();
        assert_eq!(
            b.next(Some(Duration::from_secs(12)), 0.5),
            Duration::from_secs(12)
        );
        assert_eq!(
            b.next(Some(Duration::from_secs(3600)), 0.5),
            RETRY_AFTER_MAX
        );
        b.reset();
        assert_eq!(b.next(None, 1.0), BACKOFF_FIRST);
    }

    fn pusher(url: &str, stats: &Stats) -> Pusher {
        let s = Settings::resolve(
            &Given {
                endpoint: url,
                ..Given::default()
            },
            &|_: &str| None,
        )
        .unwrap();
        Pusher::start(&s, stats.clone()).unwrap()
    }

    fn dropped(stats: &Stats, reason: &str) -> u64 {
        stats
            .dropped
            .get_or_create(&vec![("reason".into(), reason.into())])
            .get()
    }

    /// A receiver that is not there: pushes never wait, the queue stays
    /// bounded (oldest dropped and counted), every request is accounted for.
    #[test]
    fn unreachable_receiver_queue_is_bounded_and_every_request_counted() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l); // nothing listens there now
        let stats = Stats::default();
        let mut p = pusher(&format!("http://{addr}"), &stats);
        let t0 = Instant::now();
        for _ in 0..100 {
            p.push(vec![0u8; 1000]);
        }
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "push waited {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
        {
            let q = p.shared.lock();
            assert!(q.items.len() <= QUEUE, "{} queued", q.items.len());
        }
        let t0 = Instant::now();
        let why = p.finish(Some(vec![1u8; 10]));
        assert!(t0.elapsed() < EXIT_DEADLINE + Duration::from_millis(300));
        assert!(
            why.as_deref().is_some_and(|w| w.contains("connect")),
            "{why:?}"
        );
        let fails = stats
            .failures
            .get_or_create(&vec![("cause".into(), "connect".into())])
            .get();
        assert!(fails >= 2, "connect failures {fails}");
        let all: u64 = ["queue_full", "superseded", "refused", "exit"]
            .iter()
            .map(|r| dropped(&stats, r))
            .sum();
        assert_eq!(all, 101, "every request dropped once: {all}");
        assert!(dropped(&stats, "queue_full") >= 100 - QUEUE as u64 - 1);
        assert_eq!(dropped(&stats, "exit"), 1);
        assert_eq!(stats.sent.get(), 0);
    }

    /// A receiver that accepts and never answers: the exit still takes the
    /// deadline, not the timeout (10 s) per queued request.
    #[test]
    fn silent_receiver_exit_within_the_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stats = Stats::default();
        let mut p = pusher(&format!("http://{addr}"), &stats);
        for _ in 0..3 {
            p.push(vec![0u8; 100]);
        }
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let why = p.finish(Some(vec![1u8; 10]));
        let took = t0.elapsed();
        assert!(
            took >= EXIT_DEADLINE - Duration::from_millis(100)
                && took < EXIT_DEADLINE + Duration::from_millis(300),
            "{took:?}"
        );
        assert!(
            why.as_deref().is_some_and(|w| w.contains("timeout")),
            "{why:?}"
        );
        let all: u64 = ["queue_full", "superseded", "refused", "exit"]
            .iter()
            .map(|r| dropped(&stats, r))
            .sum();
        assert_eq!(all, 4, "3 superseded + the last one");
        drop(l);
    }

    /// A receiver that answers 503 with Retry-After, then 200: the request is
    /// retried after the wait it asked for, and delivered.
    #[test]
    fn retries_after_503_and_delivers() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let mut times = Vec::new();
            for answer in ["503 Service Unavailable\r\nRetry-After: 2", "200 OK"] {
                let (mut s, _) = l.accept().unwrap();
                times.push(Instant::now());
                // the whole request (head and 100-byte body), so that closing sends no RST
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.ends_with(&[0u8; 100]) {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 {answer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
            times[1] - times[0]
        });
        let stats = Stats::default();
        let mut p = pusher(&format!("http://{addr}"), &stats);
        p.push(vec![0u8; 100]);
        let gap = server.join().unwrap();
        assert!(
            gap >= Duration::from_secs(2) && gap < Duration::from_secs(3),
            "retried after {gap:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(stats.sent.get(), 1);
        let f = stats
            .failures
            .get_or_create(&vec![("cause".into(), "http_503".into())])
            .get();
        assert_eq!(f, 1);
        p.finish(None);
    }
}
