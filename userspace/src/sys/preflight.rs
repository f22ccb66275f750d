//! Checks before loading anything, each failing with one clear sentence.
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability set of this process.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Whether capabilities `caps` (a CapEff mask) let the kernel take bpf(2) commands that
/// create maps and load programs: CAP_BPF, or CAP_SYS_ADMIN (before 5.8 the only one).
pub fn can_bpf(caps: u64) -> bool {
    caps & (1u64 << CAP_BPF | 1u64 << CAP_SYS_ADMIN) != 0
}

/// The passive views need CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN (or CAP_SYS_ADMIN), and
/// bpf(2) not refused by a seccomp filter (`crate::sys::bpf::seccomp_refusal`). With them,
/// RLIMIT_MEMLOCK is raised (`raise_memlock`) before anything loads.
pub fn require_bpf_caps() -> Result<()> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
    ]
    .into_iter()
    .filter(|(c, _)| !has(*c) && !has(CAP_SYS_ADMIN))
    .map(|(_, n)| n)
    .collect();
    if !missing.is_empty() {
        bail!(
            "loading kernel programs needs root or the capabilities {} (missing: {}); run with sudo",
            "CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN",
            missing.join(", ")
        );
    }
    if let Some(why) = crate::sys::bpf::seccomp_refusal() {
        bail!("{why}");
    }
    raise_memlock();
    Ok(())
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (later ones to the
/// memory cgroup), whose default (8 MiB, 64 KiB in many containers) is far
/// below the views' maps. Raise it to unlimited (allowed with
/// CAP_SYS_RESOURCE, or when the hard limit already is), else the soft limit
/// to the hard one (always allowed), as libbpf and Cilium do. Returns the soft
/// limit now in force (`None`: unlimited).
pub fn raise_memlock() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    if setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY).is_err() {
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK) {
            let _ = setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard);
        }
    }
    memlock_limit()
}

/// The soft RLIMIT_MEMLOCK in bytes (`None`: unlimited).
pub fn memlock_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft != RLIM_INFINITY => Some(soft),
        _ => None,
    }
}

/// Kernel BTF is needed for CO-RE relocations.
pub fn require_btf() -> Result<()> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!("this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): rttscope needs a kernel built with CONFIG_DEBUG_INFO_BTF=y");
    }
    Ok(())
}

/// Mount point of the cgroup v2 hierarchy (unified or hybrid layout) in
/// this mount namespace, if any.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() >= 3 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    })
}

/// The cgroup v2 root, or an error sentence if the kernel has none.
pub fn cgroup2_root() -> Result<PathBuf> {
    if let Some(p) = cgroup2_mount() {
        return Ok(p);
    }
    if !std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .contains("cgroup2")
    {
        bail!("this kernel has no cgroup v2 (no cgroup2 in /proc/filesystems): the TCP view's sock_ops program attaches to a cgroup v2 directory");
    }
    // A private mount namespace without it (`ip netns exec` remounts /sys):
    // open_cgroup() mounts the hierarchy briefly to get a directory fd.
    Ok(PathBuf::from("(cgroup2 root, mounted privately)"))
}

/// Open the cgroup directory to attach to: `path` or the cgroup v2 root.
/// Without a cgroup2 mount in this mount namespace, the (single, shared)
/// cgroup v2 hierarchy is mounted on a private temporary directory, opened,
/// and lazily unmounted at once: the open fd is all the attach needs.
pub fn open_cgroup(path: Option<&Path>) -> Result<(std::fs::File, PathBuf)> {
    if let Some(p) = path {
        let p = check_cgroup(p)?;
        let f = std::fs::File::open(&p)
            .map_err(|e| anyhow::anyhow!("opening cgroup {}: {e}", p.display()))?;
        return Ok((f, p));
    }
    if let Some(root) = cgroup2_mount() {
        let f = std::fs::File::open(&root)
            .map_err(|e| anyhow::anyhow!("opening cgroup {}: {e}", root.display()))?;
        return Ok((f, root));
    }
    cgroup2_root()?; // the kernel-has-no-cgroup2 sentence
                     // A fresh 0700 directory with a random name (sys/files.rs), never a guessable one.
    let dir = crate::sys::files::create_private_dir("rttscope-cgroup2-")?;
    let mounted = nix::mount::mount(
        Some("cgroup2"),
        &dir,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    let opened = mounted
        .map_err(anyhow::Error::from)
        .and_then(|_| Ok(std::fs::File::open(&dir)?));
    let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(&dir);
    let f = opened.map_err(|e| anyhow::anyhow!("no cgroup v2 hierarchy is mounted here and mounting one privately failed ({e}): mount one, e.g. `mount -t cgroup2 none /sys/fs/cgroup/unified`"))?;
    Ok((
        f,
        PathBuf::from("cgroup2 root (mounted privately: not mounted in this mount namespace)"),
    ))
}

/// A cgroup directory given by the user must be inside a cgroup v2 mount.
pub fn check_cgroup(path: &Path) -> Result<PathBuf> {
    let root = cgroup2_mount().ok_or_else(|| {
        anyhow::anyhow!(
            "--cgroup {}: no cgroup v2 hierarchy is mounted in this mount namespace",
            path.display()
        )
    })?;
    let p = path
        .canonicalize()
        .map_err(|_| anyhow::anyhow!("cgroup '{}' does not exist", path.display()))?;
    if !p.starts_with(&root) {
        bail!(
            "cgroup '{}' is not in the cgroup v2 hierarchy mounted at {}",
            path.display(),
            root.display()
        );
    }
    Ok(p)
}

/// `uname -r`.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// (major, minor) of the running kernel.
pub fn kernel_version() -> (u32, u32) {
    let r = kernel_release();
    let mut it = r
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_version_parses() {
        let (maj, _) = kernel_version();
        assert!(maj >= 3);
    }

    #[test]
    fn bad_cgroup_is_one_sentence() {
        if cgroup2_mount().is_none() {
            return;
        }
        let e = check_cgroup(Path::new("/nonexistent/cg"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
