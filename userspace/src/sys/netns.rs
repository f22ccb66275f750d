//! Network namespaces: names (as `ip netns` knows them) to inode numbers
//! (what the kernel programs record), and running code inside one.
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub const NETNS_RUN_DIR: &str = "/var/run/netns";
/// The name used for the namespace of PID 1 (the host's).
pub const HOST: &str = "host";
/// PID 1's namespace file.
const PID1_NET: &str = "/proc/1/ns/net";

/// A namespace that could not be opened or entered: not a failure of what was to run in it
/// (`--all-netns` skips such a namespace and counts it; [`not_entered`] finds one in a chain).
#[derive(Debug, thiserror::Error)]
pub enum EnterError {
    #[error("opening network namespace '{name}': {why}")]
    Open { name: String, why: std::io::Error },
    #[error(
        "entering network namespace '{name}' needs CAP_SYS_ADMIN (setns); \
         without it rttscope can observe only the namespace it runs in"
    )]
    NeedsSysAdmin { name: String },
    #[error("entering network namespace '{name}': {why}")]
    Setns {
        name: String,
        why: nix::errno::Errno,
    },
}

/// The [`EnterError`] in `e`'s chain, if that is why it failed.
pub fn not_entered(e: &anyhow::Error) -> Option<&EnterError> {
    e.chain().find_map(|c| c.downcast_ref::<EnterError>())
}

/// A network namespace we can enter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNs {
    pub name: String,
    pub path: PathBuf,
    pub inode: u32,
}

fn inode_of(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .ino() as u32)
}

/// Inode of the calling thread's network namespace.
pub fn current_inode() -> Result<u32> {
    inode_of(Path::new("/proc/thread-self/ns/net"))
}

/// The host's namespace file: PID 1's, or where that cannot be read (PID 1 more privileged
/// than rttscope: a sandbox, a container without the host's PID namespace, `hidepid`) the
/// calling thread's when that is the initial namespace ([`INIT_NET_INODE`]), opened once and
/// held for the process: `/proc/self/fd/N` names it from any thread, for the whole run.
fn host_path() -> Result<PathBuf> {
    static HELD: std::sync::OnceLock<File> = std::sync::OnceLock::new();
    let pid1 = match inode_of(Path::new(PID1_NET)) {
        Ok(_) => return Ok(PathBuf::from(PID1_NET)),
        Err(e) => e,
    };
    let held = match HELD.get() {
        Some(f) => f,
        None => {
            let mine = File::open("/proc/thread-self/ns/net")
                .context("opening /proc/thread-self/ns/net")?;
            if mine.metadata()?.ino() != u64::from(INIT_NET_INODE) {
                bail!(
                    "the host's network namespace cannot be opened here: {pid1:#} (PID 1 is \
                     more privileged than rttscope, or hidden by hidepid) and rttscope does not \
                     run in it"
                );
            }
            HELD.get_or_init(|| mine)
        }
    };
    Ok(PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(held)
    )))
}

/// Resolve a namespace name: `host` (PID 1's: [`host_path`]), `self`, a name under
/// /var/run/netns, or a path to a namespace file (/proc/PID/ns/net).
pub fn resolve(name: &str) -> Result<NetNs> {
    let path = match name {
        HOST => host_path()?,
        "self" => PathBuf::from("/proc/self/ns/net"),
        n if n.starts_with('/') => PathBuf::from(n),
        n => {
            if n.contains('/') || n.is_empty() {
                bail!("'{n}' is not a network namespace name");
            }
            Path::new(NETNS_RUN_DIR).join(n)
        }
    };
    if !path.exists() {
        bail!(
            "unknown network namespace '{name}' (not found at {}; see `ip netns list`)",
            path.display()
        );
    }
    let inode = inode_of(&path).with_context(|| format!("network namespace '{name}'"))?;
    Ok(NetNs {
        name: name.to_string(),
        path,
        inode,
    })
}

/// The inode of PID 1's namespace, read once (the first call, made before daemon mode switches
/// to uid 65534, which can no longer read /proc/1/ns/net): the host is `host` for the whole run.
pub fn host_inode() -> Option<u32> {
    static HOST_INODE: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *HOST_INODE.get_or_init(|| inode_of(Path::new(PID1_NET)).ok().or(Some(INIT_NET_INODE)))
}

/// The inode of the kernel's initial network namespace on kernels that give it a fixed one
/// (`PROC_NET_INIT_INO`, 0xEFFFFFF9; dynamic inodes start at 0xF0000000, so no other namespace
/// can have it). Used as the host's when /proc/1/ns/net cannot be read (PID 1 more privileged
/// than rttscope, e.g. in a sandbox, or after the switch to uid 65534).
pub const INIT_NET_INODE: u32 = 0xEFFF_FFF9;

/// Every network namespace we can find: named ones (/var/run/netns), the
/// host's, and those of running processes, keyed by inode. Namespaces known only
/// through a process are named `net:<inode>` (never by a PID: a PID names a process, not
/// the namespace, and changes with whichever process is found first).
pub fn all() -> BTreeMap<u32, NetNs> {
    let mut out = BTreeMap::new();
    let _ = host_inode(); // remembered while still readable
    if let Ok(host) = resolve(HOST) {
        out.insert(host.inode, host);
    } else if let Some(ino) = host_inode() {
        out.insert(
            ino,
            NetNs {
                name: HOST.to_string(),
                path: PathBuf::from(PID1_NET),
                inode: ino,
            },
        );
    }
    if let Ok(rd) = std::fs::read_dir(NETNS_RUN_DIR) {
        for e in rd.flatten() {
            if let Some(name) = e.file_name().to_str() {
                if let Ok(ns) = resolve(name) {
                    out.entry(ns.inode).or_insert(ns);
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let pid = e.file_name();
            let Some(pid) = pid
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            if let Ok(ino) = inode_of(&path) {
                out.entry(ino).or_insert(NetNs {
                    name: format!("net:{ino}"),
                    path,
                    inode: ino,
                });
            }
        }
    }
    out
}

/// Names for inodes, for display: named namespaces first, `host` for PID 1's.
pub fn names() -> BTreeMap<u32, String> {
    all().into_iter().map(|(k, v)| (k, v.name)).collect()
}

/// Whether the calling thread is already in `ns` (same nsfs device and inode).
pub fn is_current(ns: &NetNs) -> bool {
    let me = std::fs::metadata("/proc/thread-self/ns/net");
    let it = std::fs::metadata(&ns.path);
    matches!((me, it), (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino())
}

/// Run `f` inside `ns`: on the calling thread when it is already there, else
/// on a scoped thread that enters it (setns only affects that thread).
///
/// The one place rttscope calls `setns(2)`. Entering a namespace needs
/// CAP_SYS_ADMIN even when it is the one the process is in, so it is skipped
/// when not needed: a deployment with only CAP_BPF + CAP_PERFMON +
/// CAP_NET_ADMIN can then observe its own namespace.
pub fn scoped<T: Send>(ns: &NetNs, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if is_current(ns) {
        return f();
    }
    std::thread::scope(|s| {
        s.spawn(|| -> Result<T> {
            enter(ns)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in network namespace '{}' panicked", ns.name))?
    })
}

/// Move the calling thread into `ns`.
fn enter(ns: &NetNs) -> Result<()> {
    Ok(enter_path(&ns.path, &ns.name)?)
}

/// Move the calling thread into the namespace at `path` (`name` for
/// messages): the one `setns(2)` of rttscope, its lab and its tests.
pub fn enter_path(path: &Path, name: &str) -> Result<(), EnterError> {
    let name = name.to_string();
    let file = File::open(path).map_err(|why| EnterError::Open {
        name: name.clone(),
        why,
    })?;
    match nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => Err(EnterError::NeedsSysAdmin { name }),
        Err(why) => Err(EnterError::Setns { name, why }),
    }
}

/// [`scoped`] for a closure that owns what it uses.
pub fn run_in<T: Send + 'static>(
    ns: &NetNs,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    scoped(ns, f)
}

/// Whether the namespace file at `path` is still the namespace `inode`:
/// false once it is gone (`ip netns del` unlinks /var/run/netns/NAME) or
/// names another namespace (deleted and added again under the same name).
pub fn still_there(path: &Path, inode: u32) -> bool {
    matches!(inode_of(path), Ok(i) if i == inode)
}

/// A route netlink socket of one network namespace (the one the calling
/// thread was in when it was opened: it stays there), to ask whether an
/// interface still exists. Asking needs no privilege, so it keeps working
/// after the daemon drops its capabilities and uid.
pub struct LinkProbe(crate::sys::rtnl::Rtnl);

impl LinkProbe {
    /// Open one in the calling thread's namespace ([`run_in`] for another).
    pub fn open() -> Result<LinkProbe> {
        crate::sys::rtnl::Rtnl::open().map(LinkProbe)
    }

    /// Whether an interface with `ifindex` exists in the socket's namespace
    /// (RTM_GETLINK: the link, or ENODEV).
    pub fn exists(&mut self, ifindex: u32) -> Result<bool> {
        Ok(self.0.link(ifindex)?.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_and_malformed() {
        let e = resolve("definitely-not-a-netns-xyz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown network namespace"), "{e}");
        assert!(resolve("a/b").is_err());
        assert!(resolve("").is_err());
    }

    #[test]
    fn link_probe_finds_loopback_and_not_a_missing_index() {
        let mut p = LinkProbe::open().unwrap();
        assert!(p.exists(1).unwrap(), "lo is ifindex 1");
        assert!(!p.exists(0x7fff_fff0).unwrap());
        let me = resolve("self").unwrap();
        assert!(still_there(&me.path, me.inode));
        assert!(!still_there(Path::new("/nonexistent/ns"), me.inode));
    }

    /// A namespace file that cannot be opened is an [`EnterError`], found through the context a
    /// caller adds; an error of what ran inside is not.
    #[test]
    fn a_namespace_that_cannot_be_opened_is_an_enter_error() {
        let e = enter_path(Path::new("/nonexistent/ns/net"), "gone").unwrap_err();
        let e = anyhow::Error::from(e).context("walking TCP sockets");
        let why = not_entered(&e).expect("an EnterError in the chain");
        assert!(matches!(why, EnterError::Open { .. }), "{why:?}");
        assert!(
            why.to_string()
                .starts_with("opening network namespace 'gone': No such file"),
            "{why}"
        );
        assert!(not_entered(&anyhow::anyhow!("verifier: invalid access")).is_none());
    }

    /// In the initial namespace, `host` is it, however PID 1's file reads.
    #[test]
    fn host_resolves_to_the_initial_namespace_from_it() {
        if current_inode().ok() != Some(INIT_NET_INODE) {
            return; // a test run inside a namespace of its own
        }
        let host = resolve(HOST).unwrap();
        assert_eq!(host.inode, INIT_NET_INODE);
        assert!(is_current(&host));
    }

    #[test]
    fn self_resolves() {
        let me = resolve("self").unwrap();
        assert_eq!(me.inode, current_inode().unwrap());
        assert!(is_current(&me));
    }

    #[test]
    fn scoped_in_own_namespace_runs_on_the_calling_thread() {
        // No setns (which needs CAP_SYS_ADMIN) when already there.
        let me = resolve("self").unwrap();
        let here = std::thread::current().id();
        let there = scoped(&me, || Ok(std::thread::current().id())).unwrap();
        assert_eq!(here, there);
    }
}
