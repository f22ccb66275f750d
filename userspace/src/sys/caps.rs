//! Least privilege for daemon mode: after the kernel programs are attached,
//! keep only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON, empty the bounding and
//! ambient sets of everything else, and set no_new_privs, so that nothing this
//! process runs later can regain privileges. Plus the startup message that
//! says which hooks were attached and which were unavailable, and why.
//!
//! Done with four raw calls (prctl PR_CAPBSET_DROP, PR_CAP_AMBIENT,
//! capset v3, PR_SET_NO_NEW_PRIVS) through `libc`: the `caps` crate would
//! wrap the same calls and add a dependency for ~40 lines.
//!
//! Capabilities are per thread: the calls act on the calling thread, which
//! must be the only thread (observe's runtime is current-thread). `current()`
//! reads every thread's set, so a thread that kept more is visible.
use anyhow::{bail, Result};

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SETPCAP: u32 = 8;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// What daemon mode keeps.
pub const KEEP: [u32; 3] = [CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Capability sets of one thread, from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapState {
    pub effective: u64,
    pub permitted: u64,
    pub bounding: u64,
    pub ambient: u64,
    pub no_new_privs: bool,
}

impl CapState {
    pub(crate) fn parse(status: &str) -> CapState {
        let hex = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        CapState {
            effective: hex("CapEff:"),
            permitted: hex("CapPrm:"),
            bounding: hex("CapBnd:"),
            ambient: hex("CapAmb:"),
            no_new_privs: status
                .lines()
                .find_map(|l| l.strip_prefix("NoNewPrivs:"))
                .is_some_and(|v| v.trim() == "1"),
        }
    }
}

/// The state of the calling thread.
pub fn thread_state() -> CapState {
    CapState::parse(&std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default())
}

/// The state of every thread of the process (tid, state).
pub fn process_state() -> Vec<(u32, CapState)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc/self/task") {
        for e in rd.flatten() {
            let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Ok(s) = std::fs::read_to_string(e.path().join("status")) {
                out.push((tid, CapState::parse(&s)));
            }
        }
    }
    out
}

pub fn mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |m, c| m | (1u64 << c))
}

/// Names of the capabilities in a mask (CAP_BPF, ...; unknown ones by number).
pub fn names(mask: u64) -> Vec<String> {
    const N: &[(u32, &str)] = &[
        (0, "CAP_CHOWN"),
        (1, "CAP_DAC_OVERRIDE"),
        (2, "CAP_DAC_READ_SEARCH"),
        (3, "CAP_FOWNER"),
        (4, "CAP_FSETID"),
        (5, "CAP_KILL"),
        (6, "CAP_SETGID"),
        (7, "CAP_SETUID"),
        (8, "CAP_SETPCAP"),
        (10, "CAP_NET_BIND_SERVICE"),
        (12, "CAP_NET_ADMIN"),
        (13, "CAP_NET_RAW"),
        (19, "CAP_SYS_PTRACE"),
        (21, "CAP_SYS_ADMIN"),
        (24, "CAP_SYS_RESOURCE"),
        (38, "CAP_PERFMON"),
        (39, "CAP_BPF"),
        (40, "CAP_CHECKPOINT_RESTORE"),
    ];
    (0..64)
        .filter(|c| mask & (1u64 << c) != 0)
        .map(|c| {
            N.iter()
                .find(|(n, _)| *n == c)
                .map(|(_, s)| s.to_string())
                .unwrap_or_else(|| format!("cap{c}"))
        })
        .collect()
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

fn prctl(op: i32, a: u64) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            op,
            a as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Keep only `KEEP` (those of them we have) in the calling thread: bounding
/// set, ambient set, permitted/effective/inheritable, then no_new_privs.
/// Returns the state afterwards. Fails with one sentence if a step fails.
pub fn drop_to_needed() -> Result<CapState> {
    drop_to(&KEEP)
}

/// As `drop_to_needed`, for any set of capabilities to keep.
pub fn drop_to(keep: &[u32]) -> Result<CapState> {
    let keep_mask = mask(keep);
    let before = thread_state();
    // 1. Bounding set (needs CAP_SETPCAP, so before it is dropped below).
    if before.effective & (1 << CAP_SETPCAP) != 0 {
        for c in 0..=last_cap() {
            if keep_mask & (1u64 << c) == 0 && before.bounding & (1u64 << c) != 0 {
                prctl(libc::PR_CAPBSET_DROP, c as u64).map_err(|e| {
                    anyhow::anyhow!("dropping capability {c} from the bounding set: {e}")
                })?;
            }
        }
    }
    // 2. Ambient set: nothing survives an exec.
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc < 0 {
        bail!(
            "clearing the ambient capability set: {}",
            std::io::Error::last_os_error()
        );
    }
    // 3. Permitted and effective: only what we keep (and have).
    let new = before.permitted & keep_mask;
    let mut data = [CapData::default(); 2];
    data[0].permitted = new as u32;
    data[0].effective = new as u32;
    data[1].permitted = (new >> 32) as u32;
    data[1].effective = (new >> 32) as u32;
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: header and two data structs as capset(2) v3 expects.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if rc < 0 {
        bail!(
            "dropping capabilities (capset): {}",
            std::io::Error::last_os_error()
        );
    }
    // 4. No privilege gain through exec (setuid, file capabilities).
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)
        .map_err(|e| anyhow::anyhow!("setting no_new_privs: {e}"))?;
    Ok(thread_state())
}

/// For a thread that must keep working after the process switches user ([`switch_user`]
/// changes every thread's uid, through glibc, which aborts the process if a thread cannot):
/// keep only `KEEP` and what the switch needs (CAP_SETUID, CAP_SETGID), permitted across the
/// switch (PR_SET_KEEPCAPS, this thread). After the switch the thread calls
/// [`after_user_switch`].
pub fn keep_needed_across_user_switch() -> Result<CapState> {
    const CAP_SETGID: u32 = 6;
    const CAP_SETUID: u32 = 7;
    prctl(libc::PR_SET_KEEPCAPS, 1).map_err(|e| anyhow::anyhow!("keeping capabilities: {e}"))?;
    let mut keep = KEEP.to_vec();
    keep.extend([CAP_SETGID, CAP_SETUID]);
    drop_to(&keep)
}

/// In a thread prepared by [`keep_needed_across_user_switch`], once the process runs as
/// another user: only `KEEP` left, and effective. `Ok(false)`: no switch yet.
pub fn after_user_switch() -> Result<bool> {
    // SAFETY: getuid has no arguments.
    if unsafe { libc::getuid() } == 0 {
        return Ok(false);
    }
    raise_effective()?;
    drop_to_needed()?;
    Ok(true)
}

/// Make the calling thread's permitted capabilities effective (a user switch clears the
/// effective set of a thread that kept its permitted one).
pub fn raise_effective() -> Result<()> {
    let now = thread_state();
    if now.effective == now.permitted {
        return Ok(());
    }
    let mut data = [CapData::default(); 2];
    data[0].permitted = now.permitted as u32;
    data[0].effective = now.permitted as u32;
    data[1].permitted = (now.permitted >> 32) as u32;
    data[1].effective = (now.permitted >> 32) as u32;
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: header and two data structs as capset(2) v3 expects.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if rc < 0 {
        bail!(
            "raising the permitted capabilities (capset): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Whether the process runs as (effective) uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// The unprivileged user the daemon runs as once attached (`nobody`).
pub const UNPRIVILEGED_ID: u32 = 65534;

/// Run as `uid`:`gid` (no supplementary groups) from now on, keeping this
/// thread's capabilities (they are dropped to the few needed afterwards:
/// `drop_to_needed`). Nothing is done when the process does not run as
/// root. The process is made dumpable again, so that its /proc/self files
/// (fdinfo for the program statistics, status) stay its own; other threads
/// change user too (glibc applies set*id to every thread) and lose their
/// capabilities. Returns whether the user changed; not when the process
/// lacks CAP_SETUID or CAP_SETGID (a deployment granting only the three it
/// keeps: it stays uid 0, with those three).
pub fn switch_user(uid: u32, gid: u32) -> Result<bool> {
    const CAP_SETGID: u32 = 6;
    const CAP_SETUID: u32 = 7;
    // SAFETY: getuid/geteuid have no arguments.
    if unsafe { libc::getuid() } != 0 && unsafe { libc::geteuid() } != 0 {
        return Ok(false);
    }
    let before = thread_state();
    if before.effective & mask(&[CAP_SETGID, CAP_SETUID]) != mask(&[CAP_SETGID, CAP_SETUID]) {
        return Ok(false);
    }
    prctl(libc::PR_SET_KEEPCAPS, 1).map_err(|e| anyhow::anyhow!("keeping capabilities: {e}"))?;
    let os = |what: &str| anyhow::anyhow!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain system calls with integer arguments (setgroups: none).
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            bail!(os("dropping supplementary groups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            bail!(os(&format!("switching to group {gid}")));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            bail!(os(&format!("switching to user {uid}")));
        }
    }
    // The permitted set survived (keepcaps); the effective set was cleared.
    let mut data = [CapData::default(); 2];
    data[0].permitted = before.permitted as u32;
    data[0].effective = before.permitted as u32;
    data[1].permitted = (before.permitted >> 32) as u32;
    data[1].effective = (before.permitted >> 32) as u32;
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: header and two data structs as capset(2) v3 expects.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    if rc < 0 {
        bail!(os("restoring capabilities after the user switch (capset)"));
    }
    prctl(libc::PR_SET_KEEPCAPS, 0).map_err(|e| anyhow::anyhow!("keepcaps off: {e}"))?;
    prctl(libc::PR_SET_DUMPABLE, 1).map_err(|e| anyhow::anyhow!("dumpable: {e}"))?;
    Ok(true)
}

/// One line: what the process now holds.
pub fn describe(s: &CapState) -> String {
    let eff = names(s.effective);
    format!(
        "capabilities: {} (bounding set: {}), no_new_privs={}",
        if eff.is_empty() {
            "none".to_string()
        } else {
            eff.join(", ")
        },
        if s.bounding == s.effective {
            "the same".to_string()
        } else {
            names(s.bounding).join(", ")
        },
        s.no_new_privs as u8
    )
}

/// Threads that hold more than `allowed` (after a drop; should be none).
pub fn threads_holding_more(allowed: u64) -> Vec<u32> {
    process_state()
        .into_iter()
        .filter(|(_, s)| s.effective & !allowed != 0 || s.permitted & !allowed != 0)
        .map(|(t, _)| t)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let s = CapState::parse(
            "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000000c000001000\nCapEff:\t000000c000001000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n",
        );
        assert_eq!(s.effective, mask(&KEEP));
        assert!(s.no_new_privs);
        assert_eq!(
            names(s.effective),
            vec!["CAP_NET_ADMIN", "CAP_PERFMON", "CAP_BPF"]
        );
        assert!(describe(&s).contains("no_new_privs=1"));
    }

    #[test]
    fn drop_on_a_thread_keeps_exactly_the_three() {
        // Capabilities are per thread: drop on a thread of our own, so the
        // test process (and other tests) keep theirs.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let (before, after) = std::thread::spawn(|| {
            let before = thread_state();
            let after = drop_to_needed().unwrap();
            (before, after)
        })
        .join()
        .unwrap();
        assert_eq!(
            after.effective,
            before.permitted & mask(&KEEP),
            "{}",
            describe(&after)
        );
        assert_eq!(after.permitted, after.effective);
        assert!(after.no_new_privs);
        assert_eq!(after.ambient, 0);
        if before.effective & (1 << CAP_SETPCAP) != 0 {
            assert_eq!(
                after.bounding,
                before.bounding & mask(&KEEP),
                "{}",
                describe(&after)
            );
        }
        // The rest of the process is untouched.
        assert_eq!(thread_state().effective, before.effective);
        // What a dropped thread can no longer do: unshare(CLONE_NEWUTS) needs
        // CAP_SYS_ADMIN. Control: the same call on an undropped thread works.
        // (A UTS namespace of a thread that then exits changes nothing else.)
        // SAFETY: unshare with a flag only.
        let control = std::thread::spawn(|| unsafe { libc::unshare(libc::CLONE_NEWUTS) })
            .join()
            .unwrap();
        let dropped = std::thread::spawn(|| {
            drop_to_needed().unwrap();
            // SAFETY: unshare with a flag only.
            unsafe { libc::unshare(libc::CLONE_NEWUTS) }
        })
        .join()
        .unwrap();
        assert_eq!(
            (control, dropped),
            (0, -1),
            "unshare(CLONE_NEWUTS) before/after the drop"
        );
    }
}
