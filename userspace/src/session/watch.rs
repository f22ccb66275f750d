//! The observed namespaces, cgroups and interfaces (what each view declares
//! in [`Watched`]), checked once per interval: one that disappears (`ip
//! netns del`, `ip link del`, `rmdir`) is reported once and counted in the
//! view's counters, and the rest goes on.
use std::path::PathBuf;

use crate::sys::netns;
use crate::views::view::{Attached, Counters, Watched};

#[derive(Default)]
pub(super) struct Watch {
    netns: Vec<WatchedNs>,
    ifaces: Vec<WatchedIface>,
    cgroups: Vec<WatchedCgroup>,
    /// Per view (session order): `netns_vanished`, `ifaces_vanished`,
    /// `cgroup_vanished`, as it declared them.
    counts: Vec<Counters>,
}

struct WatchedNs {
    name: String,
    path: PathBuf,
    inode: u32,
    /// The views counting it in their `netns_vanished`.
    counted_by: Vec<usize>,
    gone: bool,
}

struct WatchedIface {
    /// As given: DEV (the observer's namespace) or NETNS:DEV.
    label: String,
    ifindex: u32,
    /// Index into `Watch::netns` of its namespace (None: the observer's own).
    ns: Option<usize>,
    /// A netlink socket in its namespace (None: could not open one; unchecked).
    probe: Option<netns::LinkProbe>,
    gone: bool,
    view: usize,
    loss: &'static str,
}

/// A view's `--cgroup` directory and its inode at attach (the root is not
/// watched): a removed one (or removed and made again: the programs stay on
/// the old one) gets one notice.
struct WatchedCgroup {
    path: PathBuf,
    inode: u64,
    view: usize,
    loss: &'static str,
    gone: bool,
}

impl Watch {
    /// What each view declared.
    pub(super) fn new(views: &mut [Attached]) -> Watch {
        let mut w = Watch::default();
        for (i, v) in views.iter_mut().enumerate() {
            let watched = std::mem::take(&mut v.watched);
            let mut counts = Counters::new();
            w.add(i, watched, &mut counts);
            w.counts.push(counts);
        }
        w
    }

    fn add(&mut self, view: usize, watched: Watched, counts: &mut Counters) {
        use std::os::unix::fs::MetadataExt;
        if let Some(c) = watched.cgroup {
            if let Ok(m) = std::fs::metadata(&c) {
                counts.insert("cgroup_vanished", 0);
                self.cgroups.push(WatchedCgroup {
                    path: c,
                    inode: m.ino(),
                    view,
                    loss: watched.cgroup_loss,
                    gone: false,
                });
            }
        }
        if let Some(list) = watched.netns {
            counts.insert("netns_vanished", 0);
            for ns in &list {
                self.ns_index(ns, Some(view));
            }
        }
        let Some(ifaces) = watched.ifaces else {
            return;
        };
        counts.insert("ifaces_vanished", 0);
        for a in ifaces {
            let Ok(ns) = netns::resolve(&a.netns) else {
                continue;
            };
            if ns.inode != a.netns_inode {
                continue; // already replaced: nothing sensible to watch
            }
            let idx = self.ns_index(&ns, None);
            let probe = match idx {
                None => netns::LinkProbe::open().ok(),
                Some(_) => netns::run_in(&ns, netns::LinkProbe::open).ok(),
            };
            self.ifaces.push(WatchedIface {
                label: if a.netns == "self" {
                    a.iface.clone()
                } else {
                    format!("{}:{}", a.netns, a.iface)
                },
                ifindex: a.ifindex,
                ns: idx,
                probe,
                gone: false,
                view,
                loss: watched.iface_loss,
            });
        }
    }

    /// A namespace's entry (made on first use); None for the observer's own
    /// namespace and the host's, which do not go away.
    fn ns_index(&mut self, ns: &netns::NetNs, counted_by: Option<usize>) -> Option<usize> {
        if ns.name == "self" || ns.name == netns::HOST || netns::is_current(ns) {
            return None;
        }
        let i = match self.netns.iter().position(|n| n.inode == ns.inode) {
            Some(i) => i,
            None => {
                self.netns.push(WatchedNs {
                    name: ns.name.clone(),
                    path: ns.path.clone(),
                    inode: ns.inode,
                    counted_by: Vec::new(),
                    gone: false,
                });
                self.netns.len() - 1
            }
        };
        if let Some(v) = counted_by {
            self.netns[i].counted_by.push(v);
        }
        Some(i)
    }

    /// What the watch counted for a view (session order).
    pub(super) fn counters(&self, view: usize) -> Counters {
        self.counts.get(view).cloned().unwrap_or_default()
    }

    fn count(&mut self, view: usize, what: &'static str) {
        if let Some(c) = self.counts.get_mut(view) {
            *c.entry(what).or_default() += 1;
        }
    }

    /// What disappeared since the last check, one notice line each.
    pub(super) fn check(&mut self) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let mut notices = Vec::new();
        let mut counted = Vec::new();
        for c in self.cgroups.iter_mut().filter(|c| !c.gone) {
            if std::fs::metadata(&c.path).map_or(true, |m| m.ino() != c.inode) {
                c.gone = true;
                counted.push((c.view, "cgroup_vanished"));
                notices.push(format!(
                    "cgroup {} is gone (removed?); {}, the rest goes on",
                    c.path.display(),
                    c.loss
                ));
            }
        }
        for n in self.netns.iter_mut().filter(|n| !n.gone) {
            if !netns::still_there(&n.path, n.inode) {
                n.gone = true;
                counted.extend(n.counted_by.iter().map(|v| (*v, "netns_vanished")));
                notices.push(format!(
                    "network namespace {} is gone (deleted?); its flows and interfaces are no longer seen, the rest goes on",
                    n.name
                ));
            }
        }
        for i in self.ifaces.iter_mut().filter(|i| !i.gone) {
            let ns_gone = i.ns.is_some_and(|n| self.netns[n].gone);
            let dev_gone = !ns_gone
                && match i.probe.as_mut() {
                    // an error (timeout, ...) is not taken as gone
                    Some(p) => matches!(p.exists(i.ifindex), Ok(false)),
                    None => false,
                };
            if ns_gone || dev_gone {
                i.gone = true;
                i.probe = None;
                counted.push((i.view, "ifaces_vanished"));
                notices.push(format!(
                    "interface {} is gone (deleted?); {}, the other views and interfaces go on",
                    i.label, i.loss
                ));
            }
        }
        for (view, what) in counted {
            self.count(view, what);
        }
        notices
    }
}
