//! Helpers for the lab's tests (tests/tests/lab.rs) and its benchmark
//! (scripts/bench/lab.rs): ping through a testbed, UDP socket buffers.
use std::net::UdpSocket;

use rttscope::lab::testbed::{Role, Testbed};

/// Ping results: RTTs (ms) of the replies, and how many were sent.
pub struct Ping {
    pub rtts: Vec<f64>,
    pub sent: usize,
}

impl Ping {
    pub fn pct(&self, q: f64) -> f64 {
        let mut v = self.rtts.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
    pub fn loss(&self) -> f64 {
        1.0 - self.rtts.len() as f64 / self.sent as f64
    }
}

/// ping from the client namespace to `dst`, `count` echo requests `interval` apart.
pub fn ping(tb: &Testbed, dst: &str, count: usize, interval: &str) -> Ping {
    let out = tb
        .command(Role::Cli, "ping")
        .args([
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            interval,
            "-W",
            "2",
            dst,
        ])
        .output()
        .expect("ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next())
        .filter_map(|t| t.parse().ok())
        .collect();
    Ping { rtts, sent: count }
}

/// SO_RCVBUFFORCE of a socket (root: beyond net.core.rmem_max).
pub fn set_rcvbuf(s: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: valid fd and int for the call.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &bytes as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}
