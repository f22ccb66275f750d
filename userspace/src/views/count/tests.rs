//! The count view against the kernel (root; skipped otherwise unless
//! RTTSCOPE_REQUIRE_PRIVILEGED is set): attached to a cgroup of its own, under
//! each loader built in, it must count exactly the UDP datagrams a process in
//! that cgroup sends itself over loopback, nothing of the host's other
//! traffic, and leave no program behind.
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;
use crate::views::view::{Counters, NsNames, ReadCtx};

/// Datagrams sent (the child's exit code carries how many it received: < 101).
const N: u32 = 100;
/// Their payload; each packet is an IPv4 header (20), a UDP header (8) and this.
const PAYLOAD: usize = 100;

fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("RTTSCOPE_REQUIRE_PRIVILEGED").is_some() {
        panic!("privileged tests must run as root (RTTSCOPE_REQUIRE_PRIVILEGED is set)");
    }
    eprintln!("skipping: needs root");
    false
}

/// A cgroup v2 child of the root with a unique name, removed on drop.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new() -> Cgroup {
        let root = crate::sys::preflight::cgroup2_mount().expect("a cgroup v2 mount");
        let dir = root.join(format!("rtscount{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Cgroup(dir)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // the child has been reaped, but leaving the cgroup may take a moment
        let until = Instant::now() + Duration::from_secs(5);
        while let Err(e) = std::fs::remove_dir(&self.0) {
            if Instant::now() > until {
                eprintln!("removing {}: {e}", self.0.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// In a forked child: move into the cgroup, send `N` datagrams of `PAYLOAD`
/// bytes from one loopback socket to another, receive them; exit with how
/// many arrived (101.. on a failed step). Only system calls between fork and
/// exit (the test process has other threads).
///
/// # Safety
/// Call only in the child of fork().
unsafe fn child(procs: &CStr) -> i32 {
    // SAFETY: plain system calls on local buffers.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
        if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            return 101;
        }
        libc::close(fd);
        let rx = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let tx = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let sa = (&raw mut addr).cast::<libc::sockaddr>();
        if rx < 0
            || tx < 0
            || libc::bind(rx, sa, len) != 0
            || libc::getsockname(rx, sa, &mut len) != 0
        {
            return 102;
        }
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        let tvp = (&raw const tv).cast();
        let tvlen = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        if libc::setsockopt(rx, libc::SOL_SOCKET, libc::SO_RCVTIMEO, tvp, tvlen) != 0 {
            return 103;
        }
        let buf = [0x5au8; PAYLOAD];
        let mut got = 0;
        for _ in 0..N {
            if libc::sendto(tx, buf.as_ptr().cast(), PAYLOAD, 0, sa, len) != PAYLOAD as isize {
                return 104;
            }
            // one at a time: the receive queue never overflows
            let mut r = [0u8; 2 * PAYLOAD];
            if libc::recv(rx, r.as_mut_ptr().cast(), r.len(), 0) == PAYLOAD as isize {
                got += 1;
            }
        }
        got
    }
}

/// Fork a child that does [`child`] inside `cg`; how many datagrams it received.
fn traffic_in(cg: &Path) -> i32 {
    let procs = CString::new(cg.join("cgroup.procs").as_os_str().as_bytes()).unwrap();
    // SAFETY: the child runs only system calls, then _exit.
    match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        // SAFETY: in the child.
        0 => unsafe { libc::_exit(child(&procs)) },
        pid => {
            let mut status = 0;
            // SAFETY: our child.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
            assert!(libc::WIFEXITED(status), "the child did not exit: {status}");
            libc::WEXITSTATUS(status)
        }
    }
}

/// The counters as the session reads them: through [`View::read`].
fn read(view: &mut dyn View) -> Counters {
    let mut names = NsNames::new();
    let mut workloads = None;
    let mut rows = BTreeMap::new();
    let mut ctx = ReadCtx {
        names: &mut names,
        workloads: &mut workloads,
        keep_rows: true,
        rows: &mut rows,
        sink: None,
        earlier: &[],
        watched: Counters::new(),
        raw_bad: None,
    };
    let r = view.read(&mut ctx).expect("reading the count view");
    assert!(
        r.totals.is_empty() && rows.is_empty(),
        "the count view has no samples"
    );
    r.counters
}

/// The names of loaded programs starting with `rtt_count` (bpftool prog show).
fn count_progs() -> Vec<String> {
    let o = std::process::Command::new("bpftool")
        .args(["prog", "show"])
        .output()
        .expect("running bpftool prog show");
    assert!(o.status.success(), "bpftool prog show failed");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("name rtt_count"))
        .map(str::to_string)
        .collect()
}

/// The programs go when the view is dropped (freed after an RCU grace period: wait a little).
fn assert_unloaded(loader: LoaderKind) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let left = count_progs();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{loader}: programs left after drop: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn counts_exactly_the_packets_of_its_cgroup() {
    if !privileged() {
        return;
    }
    assert!(
        count_progs().is_empty(),
        "rtt_count programs loaded before the test"
    );
    for loader in LoaderKind::available() {
        let cg = Cgroup::new();
        let cfg = CountConfig {
            cgroup: Some(cg.0.clone()),
        };
        let mut view = crate::views::attach_count(loader, &cfg)
            .unwrap_or_else(|e| panic!("{loader}: attaching: {e:#}"));
        assert_eq!(view.kind(), ViewKind::Count);
        assert_eq!(view.passive().loader(), loader);
        let ids = view.passive().prog_ids();
        assert!(ids.iter().all(|(_, id)| *id > 0), "{loader}: {ids:?}");
        assert_eq!(count_progs().len(), 2, "{loader}: {:?}", count_progs());
        let before = read(view.as_mut());
        let received = traffic_in(&cg.0);
        let after = read(view.as_mut());
        let bytes = u64::from(N) * (20 + 8 + PAYLOAD as u64);
        let want: Counters = [
            ("packets_in", u64::from(N)),
            ("bytes_in", bytes),
            ("packets_out", u64::from(N)),
            ("bytes_out", bytes),
        ]
        .into();
        eprintln!("{loader}: before {before:?}, after {after:?}, received {received} of {N}");
        assert_eq!(
            received, N as i32,
            "{loader}: the child received {received} of {N}"
        );
        assert!(
            before.values().all(|v| *v == 0),
            "{loader}: an empty cgroup counted {before:?}"
        );
        assert_eq!(after, want, "{loader}: counted (left) vs sent (right)");
        let e = view
            .passive_mut()
            .raw_samples()
            .err()
            .expect("no raw samples");
        assert_eq!(e.to_string(), "the count view has no raw samples");
        assert_eq!(view.settings()["cgroup"], cg.0.display().to_string());
        drop(view);
        assert_unloaded(loader);
    }
}
