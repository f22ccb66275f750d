//! A live progress line on standard error for runs that last (probe
//! tcp-rr/udp-rr, probe irtt, compare): elapsed and total time, replies so
//! far, the last RTT, from the second second on. Drawn only when standard error is a terminal and the
//! run is not `--quiet`; otherwise nothing is written at all, so pipes, files
//! and the journal never see it. The line is redrawn in place (`\r`, erase
//! line) four times a second and erased at the end, before the results.
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::analysis::units::{fmt_duration_short, fmt_ms};
use crate::sinks::table::count;

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(250);
/// Nothing is drawn during the first second (a short run stays clean).
const DELAY: Duration = Duration::from_secs(1);

/// Whether a progress line is drawn: standard error is a terminal (not
/// `TERM=dumb`) and the user did not ask for quiet.
pub fn wanted(quiet: bool) -> bool {
    !quiet
        && std::io::stderr().is_terminal()
        && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
}

/// What the line counts, shared with the probe's reply hook.
#[derive(Debug, Default)]
pub struct Counter {
    replies: AtomicU64,
    last_rtt_ns: AtomicU64,
}

impl Counter {
    /// One reply with its RTT (called from the probe's reply hook).
    pub fn reply(&self, rtt_ns: u64) {
        self.replies.fetch_add(1, Ordering::Relaxed);
        self.last_rtt_ns.store(rtt_ns, Ordering::Relaxed);
    }
}

/// The progress line of one run; erased when dropped.
pub struct Live {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub counter: Arc<Counter>,
}

impl Live {
    /// Start drawing `label: elapsed / total, N replies, last X ms` (when
    /// [`wanted`]); `noun` names what is counted (`transaction`, `packet`),
    /// `None` for a line with the time only.
    pub fn start(
        quiet: bool,
        label: String,
        total: Option<Duration>,
        noun: Option<&'static str>,
    ) -> Live {
        let stop = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(Counter::default());
        let thread = wanted(quiet).then(|| {
            let (stop, counter) = (stop.clone(), counter.clone());
            std::thread::spawn(move || draw_until(&stop, &label, total, noun, &counter))
        });
        Live {
            stop,
            thread,
            counter,
        }
    }

    /// Whether a line is being drawn (a reply hook is then worth its cost).
    pub fn active(&self) -> bool {
        self.thread.is_some()
    }

    /// A reply hook that feeds the counter.
    pub fn hook(&self) -> crate::active::ReplyHook {
        let c = self.counter.clone();
        crate::active::ReplyHook::new(move |_, rtt_ns| c.reply(rtt_ns))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn draw_until(
    stop: &AtomicBool,
    label: &str,
    total: Option<Duration>,
    noun: Option<&str>,
    counter: &Counter,
) {
    let start = Instant::now();
    let mut err = std::io::stderr();
    let mut drawn = false;
    while !stop.load(Ordering::Relaxed) {
        // Runs over before DELAY print no line at all.
        if start.elapsed() < DELAY {
            std::thread::sleep(TICK / 5);
            continue;
        }
        drawn = true;
        let n = counter.replies.load(Ordering::Relaxed);
        let last = counter.last_rtt_ns.load(Ordering::Relaxed);
        let l = line(label, start.elapsed(), total, noun.map(|w| (n, w, last)));
        let _ = write!(err, "\r\x1b[2K{l}");
        let _ = err.flush();
        std::thread::sleep(TICK);
    }
    if drawn {
        let _ = write!(err, "\r\x1b[2K");
        let _ = err.flush();
    }
}

/// The text of the line: `probe tcp-rr 10.0.0.2: 3.2s / 10s, 1,234
/// transactions, last 0.123 ms`.
pub fn line(
    label: &str,
    elapsed: Duration,
    total: Option<Duration>,
    counted: Option<(u64, &str, u64)>,
) -> String {
    let tenths = elapsed.as_millis() / 100;
    let mut l = format!("{label}: {}.{}s", tenths / 10, tenths % 10);
    if let Some(t) = total {
        l += &format!(" / {}", fmt_duration_short(t));
    }
    if let Some((n, noun, last_ns)) = counted {
        l += &format!(", {}", count(n, noun));
        if n > 0 {
            l += &format!(", last {} ms", fmt_ms(last_ns as f64 / 1e3));
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_text() {
        let s = Duration::from_secs;
        assert_eq!(
            line(
                "probe tcp-rr h",
                Duration::from_millis(3250),
                Some(s(10)),
                Some((1, "transaction", 123_000))
            ),
            "probe tcp-rr h: 3.2s / 10s, 1 transaction, last 0.123 ms"
        );
        assert_eq!(
            line("probe irtt h", s(61), Some(s(120)), None),
            "probe irtt h: 61.0s / 120s"
        );
        assert_eq!(
            line("x", Duration::ZERO, None, Some((0, "packet", 0))),
            "x: 0.0s, 0 packets"
        );
    }

    /// Under `cargo test` standard error is captured or a pipe: no thread,
    /// nothing drawn; quiet never draws.
    #[test]
    fn quiet_or_not_a_terminal_draws_nothing() {
        let l = Live::start(true, "x".into(), None, None);
        assert!(!l.active());
        if !std::io::stderr().is_terminal() {
            assert!(!Live::start(false, "x".into(), None, None).active());
        }
    }
}
