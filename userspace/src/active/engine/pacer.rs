//! Pacing: when the next transaction may start, and how the wait is done
//! (none, spin, timerfd in the reactor, clock_nanosleep on a blocking
//! thread), stopping early when the run's stop signal is set.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::active::cancel::{cancelled, Cancel};
use crate::sys::clock::mono_ns;

/// What ends a run early: the command's cancel (a tokio task), or a flag its
/// watchdog sets (a blocking thread, which must not touch the runtime).
#[derive(Clone)]
pub(crate) enum Signal {
    Cancel(Cancel),
    Flag(Arc<AtomicBool>),
}

impl Signal {
    #[inline]
    pub fn is_set(&self) -> bool {
        match self {
            Signal::Cancel(c) => *c.borrow(),
            Signal::Flag(f) => f.load(Ordering::Relaxed),
        }
    }
}

/// How the time between bursts is waited.
enum Sleep {
    /// Back to back, or spinning on the clock (`--spin`).
    None,
    Timerfd(tokio::io::unix::AsyncFd<OwnedFd>),
    Nanosleep,
}

/// Paces transactions: bursts of `burst` transactions, bursts starting every
/// `interval` on a fixed grid (t0, t0+i, t0+2i, ...). A burst that could not
/// start on time (the previous one ran long, or the process was not scheduled)
/// starts at once; if it is late by an interval or more the grid restarts
/// from now, so missed bursts are skipped rather than sent back to back.
pub(crate) struct Pacer {
    pub(super) interval: u64,
    burst: u32,
    pub(super) in_burst: u32,
    pub(super) next: u64,
    spin: bool,
    sleep: Sleep,
    pub signal: Signal,
}

impl Pacer {
    /// `blocking`: the loop runs on a blocking thread (clock_nanosleep, the flag `signal`).
    pub fn new(
        interval: std::time::Duration,
        burst: u32,
        spin: bool,
        signal: Signal,
    ) -> Result<Self> {
        let blocking = matches!(signal, Signal::Flag(_));
        let sleep = if interval.is_zero() || spin {
            Sleep::None
        } else if blocking {
            Sleep::Nanosleep
        } else {
            Sleep::Timerfd(timerfd()?)
        };
        Ok(Pacer {
            interval: interval.as_nanos() as u64,
            burst: burst.max(1),
            in_burst: 0,
            next: 0,
            spin,
            sleep,
            signal,
        })
    }

    /// When the next transaction may start (monotonic ns); 0 = now.
    pub fn next_start(&self) -> u64 {
        if self.interval == 0 || self.in_burst != 0 {
            0
        } else {
            self.next
        }
    }

    /// Advance the schedule for the next transaction; returns the deadline
    /// to wait for, if it may not start now.
    #[inline]
    pub(super) fn plan(&mut self) -> Option<u64> {
        if self.interval == 0 {
            return None;
        }
        let mut wait = None;
        if self.in_burst == 0 {
            let now = mono_ns();
            let start = if now < self.next {
                wait = Some(self.next);
                self.next
            } else if self.next != 0 && now - self.next < self.interval {
                // Late by less than an interval: start now but keep the grid.
                self.next
            } else {
                // First burst, or late by an interval or more: restart the grid.
                now
            };
            self.next = start + self.interval;
        }
        self.in_burst = (self.in_burst + 1) % self.burst;
        wait
    }

    /// Wait until the next transaction may start. False: the run is to stop.
    /// Back to back (or within a burst) nothing is awaited: the hot path stays
    /// one flag check.
    #[inline]
    pub async fn wait(&mut self) -> Result<bool> {
        let go = match self.plan() {
            None => true,
            Some(deadline) => self.wait_until(deadline).await?,
        };
        Ok(go && !self.signal.is_set())
    }

    async fn wait_until(&mut self, deadline: u64) -> Result<bool> {
        if self.spin {
            return Ok(self.spin_until(deadline));
        }
        Ok(match &self.sleep {
            Sleep::Timerfd(t) => timerfd_wait(t, deadline, &mut self.signal).await?,
            Sleep::Nanosleep => nanosleep_until(deadline, &self.signal),
            Sleep::None => true,
        })
    }

    fn spin_until(&self, deadline: u64) -> bool {
        let mut i = 0u32;
        while mono_ns() < deadline {
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i.is_multiple_of(4096) && self.signal.is_set() {
                return false;
            }
        }
        true
    }
}

fn timerfd() -> Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: plain syscall; the fd is checked and then owned.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("creating a timerfd");
    }
    // SAFETY: fd is a freshly created, valid descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the OwnedFd stays open for as long as the AsyncFd holds it.
    unsafe { tokio::io::unix::AsyncFd::register(owned) }
        .map_err(std::io::Error::from)
        .context("registering the timerfd")
}

/// clock_nanosleep to the absolute deadline in slices of at most 100 ms.
/// False if `signal` is set.
fn nanosleep_until(deadline: u64, signal: &Signal) -> bool {
    loop {
        let now = mono_ns();
        if now >= deadline {
            return true;
        }
        if signal.is_set() {
            return false;
        }
        let until = deadline.min(now + 100_000_000);
        let ts = libc::timespec {
            tv_sec: (until / 1_000_000_000) as libc::time_t,
            tv_nsec: (until % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: plain syscall with a valid timespec; EINTR just loops.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            );
        }
    }
}

/// Arm the timerfd for the absolute deadline and wait for it in the reactor.
async fn timerfd_wait(
    timer: &tokio::io::unix::AsyncFd<OwnedFd>,
    deadline: u64,
    signal: &mut Signal,
) -> Result<bool> {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (deadline / 1_000_000_000) as libc::time_t,
            tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
        },
    };
    // SAFETY: valid fd and a fully initialised itimerspec.
    let rc = unsafe {
        libc::timerfd_settime(
            timer.get_ref().as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &spec,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("arming the timerfd");
    }
    let Signal::Cancel(cancel) = signal else {
        unreachable!("a blocking thread sleeps with clock_nanosleep")
    };
    loop {
        tokio::select! {
            _ = cancelled(cancel) => return Ok(false),
            r = timer.readable() => {
                let mut g = r.context("waiting on the timerfd")?;
                let mut b = [0u8; 8];
                match nix::unistd::read(g.get_inner().as_raw_fd(), &mut b) {
                    Ok(_) => return Ok(true),
                    Err(nix::errno::Errno::EAGAIN) => g.clear_ready(),
                    Err(e) => return Err(e).context("reading the timerfd"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pacer_keeps_the_grid() {
        let flag = Signal::Flag(Default::default());
        let mut p = Pacer::new(Duration::from_millis(10), 2, false, flag).unwrap();
        // First burst: starts now, the next one 10 ms later.
        assert_eq!(p.plan(), None);
        let first_next = p.next;
        assert_eq!(p.plan(), None, "second transaction of the burst");
        assert_eq!(p.plan(), Some(first_next), "next burst waits for the grid");
        // Late by less than an interval: the grid is kept.
        p.in_burst = 0;
        p.next = mono_ns() - 3_000_000;
        let late = p.next;
        assert_eq!(p.plan(), None);
        assert_eq!(p.next, late + 10_000_000);
        // Late by more than an interval: the grid restarts from now.
        p.in_burst = 0;
        p.next = mono_ns() - 50_000_000;
        let before = mono_ns();
        assert_eq!(p.plan(), None);
        assert!(p.next >= before + 10_000_000);
    }
}
