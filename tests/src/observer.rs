//! A running `rttscope observe --format json` (or any command printing JSON lines): its lines
//! arrive on a channel, its start line is read before [`Observer::spawn`] returns (the programs
//! are attached), and it is stopped with SIGTERM ([`Observer::stop`]) or ends by itself
//! (`--duration`, [`Observer::finish`]).
use std::io::{BufRead, BufReader, Read};
use std::process::Command;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::ChildGuard;

/// Every line `r` gives, on a channel (a thread reads them until the end or the receiver drops).
pub fn line_channel(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// Now, in Unix seconds (as the records' `ts`).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// An observer whose JSON lines arrive on a channel.
pub struct Observer {
    pub child: ChildGuard,
    pub lines: Receiver<String>,
    /// The `start` line.
    pub start: Value,
    /// When the start record reached the test (Unix seconds, as the records' `ts`).
    pub start_seen: f64,
    /// What the failures call it ("observer", "sampler", "observe").
    what: &'static str,
}

impl Observer {
    /// Spawn `cmd` and wait (up to 60 s) for its start line; `what` names it in failures
    /// ("{what} did not start: its output", "{what} failed: its stderr").
    pub fn spawn(cmd: &mut Command, what: &'static str) -> Observer {
        let mut child = ChildGuard::spawn(cmd).expect("spawn rttscope observe");
        let stdout = child.0.as_mut().unwrap().stdout.take().unwrap();
        let lines = line_channel(stdout);
        let Ok(first) = lines.recv_timeout(Duration::from_secs(60)) else {
            let out = child.wait_output(Duration::from_secs(1));
            panic!("{what} did not start: {out:?}");
        };
        let start: Value = serde_json::from_str(&first).expect("start line is JSON");
        assert_eq!(start["type"], "start", "{first}");
        Observer {
            child,
            lines,
            start,
            start_seen: unix_now(),
            what,
        }
    }

    /// Send it SIGTERM: observe prints its final report and exits.
    pub fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM to observe");
    }

    /// SIGTERM; every line up to the end record, and stderr (it must exit 0 within 30 s).
    pub fn stop(self) -> (Vec<Value>, String) {
        self.sigterm();
        let out = self.child.wait_output(Duration::from_secs(30)).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{} failed: {stderr}", self.what);
        let lines = self.lines.try_iter();
        let lines = lines.map(|l| serde_json::from_str(&l).unwrap()).collect();
        (lines, stderr)
    }

    /// Read lines until the `end` one (or `timeout`), then wait for the exit (10 s; it must exit
    /// 0): the end line, and every line read before it.
    pub fn finish(self, timeout: Duration) -> (Option<Value>, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let (mut end, mut before) = (None, Vec::new());
        while Instant::now() < deadline && end.is_none() {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(l) => {
                    let v: Value = serde_json::from_str(&l).expect("observe line is JSON");
                    if v["type"] == "end" {
                        end = Some(v);
                    } else {
                        before.push(v);
                    }
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(_) => break,
            }
        }
        let out = self.child.wait_output(Duration::from_secs(10)).unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.what,
            String::from_utf8_lossy(&out.stderr)
        );
        (end, before)
    }

    /// Our programs' ids (the start record's `sampler.prog_ids`, `[name, id]` pairs).
    pub fn sampler_prog_ids(&self) -> Vec<u32> {
        let ids = self.start["sampler"]["prog_ids"].as_array().unwrap();
        ids.iter().map(|p| p[1].as_u64().unwrap() as u32).collect()
    }
}
