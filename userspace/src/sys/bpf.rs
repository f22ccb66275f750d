//! The bpf(2) calls rttscope makes itself, in one place: the map commands
//! both loaders need on a map fd, without going through either loader's API
//! (an update with an optional key: a stack or queue map has none; the flow
//! tables are read in place, sys/mmap.rs), and program run-time statistics
//! (BPF_OBJ_GET_INFO_BY_FD, BPF_ENABLE_STATS) for the exporter; and whether
//! this process may call bpf(2) at all ([`seccomp_refusal`]).
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// `union bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    bpf_ret(cmd, attr).map(drop)
}

/// [`bpf`] returning the call's value (a file descriptor for the commands that make one).
fn bpf_ret<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size
    // passed; the pointers inside it point to live buffers of the sizes the
    // kernel will use (the callers' contracts).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `Seccomp:` of /proc/PID/status when a filter is installed (`SECCOMP_MODE_FILTER`).
pub const SECCOMP_MODE_FILTER: u8 = 2;

/// The seccomp mode in a /proc/PID/status text (`Seccomp:\t2`: 0 none, 1 strict, 2 filter);
/// `None` where the line is missing (a kernel built without CONFIG_SECCOMP) or unreadable.
pub fn seccomp_mode(status: &str) -> Option<u8> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A bpf(2) command no kernel has: the kernel answers it EINVAL, whoever asks.
const BPF_CMD_NONE: libc::c_long = 0x7fff;

/// Why this process cannot call bpf(2) at all, when the cause is its seccomp filter (the
/// default profile of container runtimes refuses bpf() to containers): one sentence, or
/// `None` when bpf() reaches the kernel. Asked once per process. The tells, all needed:
/// `Seccomp: 2` in /proc/self/status, CAP_BPF or CAP_SYS_ADMIN held (without them the kernel
/// itself refuses), a one-entry array map of 4 bytes refused (too small for RLIMIT_MEMLOCK
/// to be the cause), and a command no kernel has answered with something other than the
/// kernel's EINVAL (so the answer did not come from the kernel).
pub fn seccomp_refusal() -> Option<&'static str> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let caps = crate::sys::preflight::effective_caps();
        if seccomp_mode(&status)? != SECCOMP_MODE_FILTER || !crate::sys::preflight::can_bpf(caps) {
            return None;
        }
        let map = crate::sys::bpfprog::array_map(4).err()?;
        let mut attr = [0u64; 1];
        let none = bpf(BPF_CMD_NONE, &mut attr).err()?;
        (none.raw_os_error() != Some(libc::EINVAL)).then(|| seccomp_sentence(&map))
    })
    .as_deref()
}

/// The sentence for a bpf() refused by the process's seccomp filter (`map`: what creating a
/// 4-byte array map got).
fn seccomp_sentence(map: &io::Error) -> String {
    format!(
        "bpf() is refused by this process's seccomp filter (Seccomp: 2 in /proc/self/status; \
         even a 4-byte map gets \"{map}\" with the capabilities held, so neither they nor \
         RLIMIT_MEMLOCK are the cause): run the container with a seccomp profile that allows \
         bpf and perf_event_open, e.g. podman run --security-opt seccomp=unconfined, or a \
         profile adding those two system calls"
    )
}

/// Write `value` (exactly the map's value size) under `key` (exactly the
/// key size; `None` for stack and queue maps, where this pushes).
pub fn update(fd: BorrowedFd<'_>, key: Option<&[u8]>, value: &[u8], flags: u64) -> io::Result<()> {
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: value.as_ptr() as u64,
        flags,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a)
}

/// Remove `key` from a hash map. `Ok(false)`: it was not there.
pub fn delete(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<bool> {
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The sum over CPUs of the u64 at the start of a per-CPU map's value under `key`
/// (`Ok(None)`: no such key).
pub fn percpu_u64_sum(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<Option<u64>> {
    let mut v = vec![0u8; 8 * possible_cpus()?];
    if !lookup(fd, key, &mut v)? {
        return Ok(None);
    }
    Ok(Some(
        v.chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .fold(0u64, u64::wrapping_add),
    ))
}

/// Read the value under `key` into `value` (exactly the map's value size;
/// for a per-CPU map, the value size rounded up to 8 bytes times the
/// possible CPUs). `Ok(false)`: no such key.
pub fn lookup(fd: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The top of a stack map of u32 values: `pop` takes it off, else it is
/// only read. `Ok(None)`: the stack is empty.
pub fn stack_top(fd: BorrowedFd<'_>, pop: bool) -> io::Result<Option<u32>> {
    let mut v = 0u32;
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: 0, // stacks have no key: the kernel wants a NULL pointer
        value: (&mut v as *mut u32) as u64,
        ..Default::default()
    };
    let cmd = if pop {
        BPF_MAP_LOOKUP_AND_DELETE_ELEM
    } else {
        BPF_MAP_LOOKUP_ELEM
    };
    match bpf(cmd, &mut a) {
        Ok(()) => Ok(Some(v)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Refill a stack map of u32 values that was filled with `n - 1 .. 0` (0
/// on top) and from which exactly `taken` values were popped since (so
/// `taken` is on top, or it is empty when `taken >= n`): push `taken - 1 ..
/// 0` back. If the top is not what that says, empty it and fill it whole.
pub fn refill_stack(fd: BorrowedFd<'_>, n: u32, taken: u32) -> io::Result<()> {
    let taken = taken.min(n);
    let expected = (taken < n).then_some(taken);
    let mut from = taken;
    if stack_top(fd, false)? != expected {
        while stack_top(fd, true)?.is_some() {}
        from = n;
    }
    for i in (0..from).rev() {
        update(fd, None, &i.to_ne_bytes(), 0)?;
    }
    Ok(())
}

/// The key after `key` (`None`: the first key) into `next`; `Ok(false)`: no more keys.
pub fn next_key(fd: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut a = ElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: next.as_mut_ptr() as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What the kernel says of a map (the start of `struct bpf_map_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapInfo {
    pub map_type: u32,
    pub id: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a map.
pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    let mut info = [0u32; 32];
    obj_info(
        fd.as_raw_fd(),
        info.as_mut_ptr().cast(),
        std::mem::size_of_val(&info),
    )?;
    Ok(MapInfo {
        map_type: info[0],
        id: info[1],
        key_size: info[2],
        value_size: info[3],
        max_entries: info[4],
    })
}

/// The kernel id of the program behind `fd` (`bpftool prog show id N`).
pub fn prog_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = [0u64; 64];
    obj_info(
        fd.as_raw_fd(),
        info.as_mut_ptr().cast(),
        std::mem::size_of_val(&info),
    )?;
    // struct bpf_prog_info { __u32 type; __u32 id; ... }
    Ok((info[0] >> 32) as u32)
}

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_PROG_QUERY: libc::c_long = 16;

/// The ids of the programs attached to a hook, in the order they run (BPF_PROG_QUERY; at most
/// 64). For the tcx attach types `target` is an ifindex of the calling thread's namespace.
pub fn prog_query(target: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    // union bpf_attr, query: target, attach_type, query_flags, attach_flags, prog_ids,
    // prog_cnt, ... (up to `revision`, 64 bytes)
    let mut attr = [0u64; 8];
    attr[0] = target as u64 | ((attach_type as u64) << 32);
    attr[2] = ids.as_mut_ptr() as u64;
    attr[3] = ids.len() as u64;
    match bpf(BPF_PROG_QUERY, &mut attr) {
        Ok(()) => {}
        // more than 64: the first 64 were copied
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {}
        Err(e) => return Err(e),
    }
    let n = (attr[3] as u32 as usize).min(ids.len());
    Ok(ids[..n].to_vec())
}

/// The name of a loaded program by its id (BPF_PROG_GET_FD_BY_ID, which needs CAP_SYS_ADMIN,
/// then BPF_OBJ_GET_INFO_BY_FD).
pub fn prog_name_by_id(id: u32) -> io::Result<String> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut attr = [0u64; 2]; // prog_id, next_id, open_flags
    attr[0] = id as u64;
    let fd = bpf_ret(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: a file descriptor bpf(2) just returned to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = [0u64; 64];
    obj_info(
        fd.as_raw_fd(),
        info.as_mut_ptr().cast(),
        std::mem::size_of_val(&info),
    )?;
    // struct bpf_prog_info: char name[16] at byte 64
    let bytes: Vec<u8> = info[8..10].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// Possible CPUs (`/sys/devices/system/cpu/possible`, e.g. "0-3"): the
/// number of values a per-CPU map returns per key.
pub fn possible_cpus() -> io::Result<usize> {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if let Some(n) = CPUS.get() {
        return Ok(*n);
    }
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let n = parse_cpu_list(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unreadable /sys/devices/system/cpu/possible: {text:?}"),
        )
    })?;
    Ok(*CPUS.get_or_init(|| n))
}

/// The highest CPU number + 1 of a CPU list ("0", "0-3", "0-3,8-11").
pub(crate) fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut max = None;
    for part in text.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<usize>().ok()?;
        max = Some(max.unwrap_or(0).max(last + 1));
    }
    max
}

/// Program run-time statistics source: our own program fds (found through
/// /proc/self/fdinfo by program id, so no CAP_SYS_ADMIN is needed, unlike
/// BPF_PROG_GET_FD_BY_ID).
#[derive(Debug)]
pub struct ProgStats {
    progs: Vec<(String, u32, std::os::fd::OwnedFd)>,
    /// Held open while we enabled run-time statistics ourselves (BPF_ENABLE_STATS).
    stats_fd: Option<std::os::fd::OwnedFd>,
}

/// Kernel run-time statistics of one program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProgRun {
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

impl ProgStats {
    /// Find the fds of the programs with these ids among our own open fds.
    pub fn from_ids(progs: &[(&str, u32)]) -> ProgStats {
        let mut out = Vec::new();
        let ids: HashMap<u32, &str> = progs.iter().map(|(n, id)| (*id, *n)).collect();
        if let Ok(rd) = std::fs::read_dir("/proc/self/fdinfo") {
            for e in rd.flatten() {
                let Ok(fd) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let Ok(text) = std::fs::read_to_string(e.path()) else {
                    continue;
                };
                let id = text
                    .lines()
                    .find_map(|l| l.strip_prefix("prog_id:"))
                    .and_then(|v| v.trim().parse::<u32>().ok());
                if let Some(id) = id {
                    if let Some(name) = ids.get(&id) {
                        if out.iter().any(|(_, i, _)| *i == id) {
                            continue;
                        }
                        // SAFETY: fcntl on an fd number we just listed; the
                        // duplicate is ours.
                        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                        if dup >= 0 {
                            // SAFETY: dup is a fresh fd owned by nobody else.
                            let owned = unsafe {
                                <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup)
                            };
                            out.push((name.to_string(), id, owned));
                        }
                    }
                }
            }
        }
        out.sort_by_key(|(_, id, _)| *id);
        ProgStats {
            progs: out,
            stats_fd: None,
        }
    }

    /// Programs found, as (name, id).
    pub fn programs(&self) -> Vec<(String, u32)> {
        self.progs.iter().map(|(n, i, _)| (n.clone(), *i)).collect()
    }

    /// Turn on kernel run-time statistics for as long as this lives
    /// (BPF_ENABLE_STATS: needs CAP_SYS_ADMIN; nothing remains after exit).
    pub fn enable_kernel_stats(&mut self) -> anyhow::Result<()> {
        // union bpf_attr for BPF_ENABLE_STATS: { __u32 type } (BPF_STATS_RUN_TIME = 0).
        let mut attr = [0u64; 2];
        // SAFETY: bpf(2) with a zeroed attr buffer of the size given.
        let fd =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, attr.as_mut_ptr(), 16usize) }
                as i32;
        if fd < 0 {
            anyhow::bail!(
                "turning on BPF run-time statistics (BPF_ENABLE_STATS needs CAP_SYS_ADMIN, or set sysctl kernel.bpf_stats_enabled=1): {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: fd is fresh and ours.
        self.stats_fd =
            Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        Ok(())
    }

    /// Whether run-time statistics are being collected now.
    pub fn kernel_stats_enabled(&self) -> bool {
        self.stats_fd.is_some()
            || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
                .map(|s| s.trim() != "0")
                .unwrap_or(false)
    }

    /// Read each program's run_time_ns / run_cnt.
    pub fn read(&self) -> Vec<(String, u32, ProgRun)> {
        use std::os::fd::AsRawFd;
        self.progs
            .iter()
            .map(|(n, id, fd)| {
                let run = prog_run(fd.as_raw_fd()).unwrap_or_default();
                (n.clone(), *id, run)
            })
            .collect()
    }
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;
/// Byte offsets of `run_time_ns` and `run_cnt` in the uapi `struct
/// bpf_prog_info` (checked against libbpf-sys's binding in a test). Raw bpf(2)
/// calls instead of libbpf, so that an aya-only build has the figures too.
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;

/// BPF_OBJ_GET_INFO_BY_FD into `info` (`len` bytes, zeroed and larger than
/// the kernel's struct: the kernel fills what it knows and checks that the
/// rest is zero).
fn obj_info(fd: i32, info: *mut u8, len: usize) -> io::Result<()> {
    // union bpf_attr, info: { __u32 bpf_fd; __u32 info_len; __aligned_u64 info; }
    let mut attr = [0u64; 2];
    attr[0] = (fd as u32 as u64) | ((len as u64) << 32);
    attr[1] = info as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)
}

/// run_time_ns / run_cnt of the program behind `fd` (BPF_OBJ_GET_INFO_BY_FD).
fn prog_run(fd: i32) -> Option<ProgRun> {
    let mut info = [0u64; 64];
    obj_info(fd, info.as_mut_ptr().cast(), std::mem::size_of_val(&info)).ok()?;
    Some(ProgRun {
        run_time_ns: info[INFO_RUN_TIME_NS / 8],
        run_cnt: info[INFO_RUN_CNT / 8],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0\n"), Some(1));
        assert_eq!(parse_cpu_list("0-3\n"), Some(4));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
        assert!(possible_cpus().unwrap() >= 1);
    }

    /// The Seccomp line of /proc/PID/status, as 6.x and 5.10 write it.
    #[test]
    fn seccomp_mode_parses() {
        let status = "Name:\trttscope\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(seccomp_mode(status), Some(SECCOMP_MODE_FILTER));
        assert_eq!(seccomp_mode("Seccomp:\t0\nSeccomp_filters:\t0\n"), Some(0));
        assert_eq!(seccomp_mode("Seccomp:  1\n"), Some(1));
        // a kernel without CONFIG_SECCOMP has no such line; the Seccomp_filters line is not it
        assert_eq!(seccomp_mode("Name:\tx\nSeccomp_filters:\t3\n"), None);
        assert_eq!(seccomp_mode("Seccomp:\tx\n"), None);
        // this test process: no filter unless the test runner is confined
        let me = std::fs::read_to_string("/proc/self/status").unwrap();
        if seccomp_mode(&me) != Some(SECCOMP_MODE_FILTER) {
            assert_eq!(seccomp_refusal(), None);
        }
    }

    #[cfg(feature = "libbpf")]
    #[test]
    fn prog_info_offsets_match_the_uapi_struct() {
        assert_eq!(
            std::mem::offset_of!(libbpf_sys::bpf_prog_info, run_time_ns),
            INFO_RUN_TIME_NS
        );
        assert_eq!(
            std::mem::offset_of!(libbpf_sys::bpf_prog_info, run_cnt),
            INFO_RUN_CNT
        );
        assert!(std::mem::size_of::<libbpf_sys::bpf_prog_info>() <= 64 * 8);
    }
}
