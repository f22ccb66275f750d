//! Sockets' cgroups to their owners (`--label-workload`): the TCP view
//! records each socket's cgroup id (its low 32 bits: the cgroup directory's
//! inode number); this index finds the directory under the cgroup v2 root
//! and names its owner ([`crate::analysis::workload`]), plus the pod's
//! namespace and name from the kubelet's log directories
//! (`/var/log/pods/<namespace>_<name>_<uid>`, `RTTSCOPE_POD_LOG_DIR`
//! overrides the path). When that directory is not readable (not a
//! Kubernetes node, not mounted into the container) pods are named by UID.
//!
//! The cgroup tree is walked again only for an id not seen before, at most
//! once per [`RESCAN_EVERY`], and at most [`MAX_CGROUPS`] directories are
//! indexed (a cgroup outside is "unknown": counted, never guessed).
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::analysis::workload::{self, Workload};

/// Directories indexed at most (a host with more cgroups is unusual).
pub const MAX_CGROUPS: usize = 65_536;
/// An unknown id makes a new walk at most this often.
pub const RESCAN_EVERY: Duration = Duration::from_secs(2);
pub const POD_LOG_DIR: &str = "/var/log/pods";

pub struct CgroupIndex {
    root: PathBuf,
    by_ino: HashMap<u32, Arc<Workload>>,
    pods: HashMap<String, (String, String)>,
    scanned: Option<Instant>,
    /// Lookups of an id no walk found (a cgroup gone, or past the cap).
    pub unknown: u64,
    /// Directories the last walk could not index (past [`MAX_CGROUPS`]).
    pub truncated: u64,
}

impl CgroupIndex {
    /// An index of the cgroup v2 tree at `root` (walked on the first lookup).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CgroupIndex {
            root: root.into(),
            by_ino: HashMap::new(),
            pods: HashMap::new(),
            scanned: None,
            unknown: 0,
            truncated: 0,
        }
    }

    /// The owner of cgroup `ino` (0: none recorded).
    pub fn get(&mut self, ino: u32) -> Option<Arc<Workload>> {
        if ino == 0 {
            return None;
        }
        if let Some(w) = self.by_ino.get(&ino) {
            return Some(w.clone());
        }
        if self.scanned.is_none_or(|t| t.elapsed() >= RESCAN_EVERY) {
            self.rescan();
            if let Some(w) = self.by_ino.get(&ino) {
                return Some(w.clone());
            }
        }
        self.unknown += 1;
        None
    }

    /// Walk the tree again (entries of cgroups still there keep their value).
    fn rescan(&mut self) {
        self.scanned = Some(Instant::now());
        self.pods = pod_names(&pod_log_dir());
        let mut found = HashMap::new();
        let mut stack = vec![(self.root.clone(), String::new())];
        self.truncated = 0;
        while let Some((dir, rel)) = stack.pop() {
            let Ok(md) = std::fs::metadata(&dir) else {
                continue;
            };
            if found.len() >= MAX_CGROUPS {
                self.truncated += 1;
                continue;
            }
            let mut w = workload::parse(if rel.is_empty() { "/" } else { &rel });
            if let Some((ns, name)) = w.pod_uid.as_ref().and_then(|u| self.pods.get(u)) {
                w.pod_namespace = Some(ns.clone());
                w.pod_name = Some(name.clone());
            }
            found.insert(md.ino() as u32, Arc::new(w));
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    stack.push((e.path(), format!("{rel}/{name}")));
                }
            }
        }
        self.by_ino = found;
    }
}

fn pod_log_dir() -> PathBuf {
    std::env::var_os("RTTSCOPE_POD_LOG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(POD_LOG_DIR))
}

/// Pod UID -> (namespace, name) from the kubelet's `<ns>_<name>_<uid>`
/// directories (namespace and pod names cannot contain `_`). Empty when the
/// directory is missing or unreadable.
pub fn pod_names(dir: &Path) -> HashMap<String, (String, String)> {
    let mut out = HashMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some((ns, pod, uid)) = split_pod_dir(&name) {
            out.insert(uid.to_ascii_lowercase(), (ns.to_string(), pod.to_string()));
        }
    }
    out
}

fn split_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let (ns, rest) = name.split_once('_')?;
    let (pod, uid) = rest.rsplit_once('_')?;
    (!ns.is_empty() && !pod.is_empty() && uid.len() == 36).then_some((ns, pod, uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_log_directory_names() {
        let uid = "0b6c3a8e-2f41-4d7a-9c55-1e2f3a4b5c6d";
        assert_eq!(
            split_pod_dir(&format!("kube-system_coredns-5d78c9869d-abcde_{uid}")),
            Some(("kube-system", "coredns-5d78c9869d-abcde", uid))
        );
        assert_eq!(split_pod_dir("nounderscore"), None);
        assert_eq!(split_pod_dir("a_b_short"), None);
        assert_eq!(split_pod_dir(&format!("_b_{uid}")), None);
    }

    #[test]
    fn index_of_a_directory_tree() {
        // A plain directory tree stands in for the cgroup tree: the index
        // only reads names and inode numbers.
        let root = std::env::temp_dir().join(format!("rtscg{}", std::process::id()));
        let uid = "0b6c3a8e-2f41-4d7a-9c55-1e2f3a4b5c6d";
        let pod = root.join(format!("kubepods/burstable/pod{uid}"));
        std::fs::create_dir_all(&pod).unwrap();
        let svc = root.join("system.slice/nginx.service");
        std::fs::create_dir_all(&svc).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino() as u32;
        let mut idx = CgroupIndex::new(&root);
        let w = idx.get(ino(&pod)).unwrap();
        assert_eq!(w.pod_uid.as_deref(), Some(uid));
        assert_eq!(w.cgroup, format!("/kubepods/burstable/pod{uid}"));
        assert_eq!(
            idx.get(ino(&svc)).unwrap().unit.as_deref(),
            Some("nginx.service")
        );
        assert_eq!(idx.get(ino(&root)).unwrap().cgroup, "/");
        assert!(idx.get(0).is_none());
        assert!(idx.get(1).is_none());
        assert_eq!(idx.unknown, 1);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
