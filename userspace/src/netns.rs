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

/// Resolve a namespace name: `host` (PID 1's), `self`, a name under
/// /var/run/netns, or a path to a namespace file (/proc/PID/ns/net).
pub fn resolve(name: &str) -> Result<NetNs> {
    let path = match name {
        HOST => PathBuf::from("/proc/1/ns/net"),
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

/// Every network namespace we can find: named ones (/var/run/netns), the
/// host's, and those of running processes, keyed by inode.
pub fn all() -> BTreeMap<u32, NetNs> {
    let mut out = BTreeMap::new();
    if let Ok(host) = resolve(HOST) {
        out.insert(host.inode, host);
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
                    name: format!("pid:{pid}"),
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

/// Run `f` on a new thread inside `ns` (setns only affects that thread).
pub fn run_in<T: Send + 'static>(
    ns: &NetNs,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let path = ns.path.clone();
    let name = ns.name.clone();
    std::thread::spawn(move || -> Result<T> {
        let file =
            File::open(&path).with_context(|| format!("opening network namespace '{name}'"))?;
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering network namespace '{name}'"))?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("thread in network namespace panicked"))?
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
    fn self_resolves() {
        let me = resolve("self").unwrap();
        assert_eq!(me.inode, current_inode().unwrap());
    }
}
