//! Display names of network namespaces for rows, records and labels: `ip
//! netns` names, `host`, or the pod or container holding a namespace
//! (`--label-workload`), decided once per namespace for the run.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::sys::netns;

/// Display names of network namespaces, refreshed when an unknown one shows up.
pub struct NsNames {
    names: BTreeMap<u32, String>,
    refreshed: Instant,
    /// Names from the pod or container holding a namespace (`--label-workload`):
    /// they win over `ip netns` names (not over `host`); the first one found stays.
    owners: BTreeMap<u32, String>,
}

impl Default for NsNames {
    fn default() -> Self {
        Self::new()
    }
}

impl NsNames {
    pub fn new() -> Self {
        NsNames {
            names: netns::names(),
            refreshed: Instant::now(),
            owners: BTreeMap::new(),
        }
    }
    /// Name a namespace by the pod or container that holds it.
    pub fn set_owner(&mut self, inode: u32, name: String) {
        if self.owners.len() < 65_536 {
            self.owners.entry(inode).or_insert(name);
        }
    }
    /// A namespace's name, decided the first time it is seen and never changed after (a
    /// label must not change mid-run); only unknown namespaces are looked up again.
    pub fn get(&mut self, inode: u32) -> String {
        if let Some(o) = self.owners.get(&inode) {
            // The pod or container first, then the `ip netns` name; the host's stays `host`.
            if self.names.get(&inode).is_none_or(|n| n != netns::HOST) {
                return o.clone();
            }
        }
        if !self.names.contains_key(&inode) && self.refreshed.elapsed() > Duration::from_millis(500)
        {
            for (k, v) in netns::names() {
                self.names.entry(k).or_insert(v);
            }
            self.refreshed = Instant::now();
        }
        self.names
            .get(&inode)
            .cloned()
            .unwrap_or_else(|| format!("net:{inode}"))
    }
}
