//! Never blind without a word (issue 41): each interval, the packets each of the sampler's
//! hooks saw (`sampler_hooks`, per interface and direction) against what the interface itself
//! moved (the kernel's counters, rtnetlink IFLA_STATS64: received for ingress, sent for
//! egress). A hook that saw no packet in an interval in which its interface moved more than
//! [`BLIND_MIN_PACKETS`] is **blind**: one sentence on stderr naming the interface, the
//! direction and the likely cause (what runs ahead of it, `chain.rs`), a `hooks` entry with
//! `blind: true` in the records and the result, and `rttscope_hook_blind` on /metrics and OTLP.
//! The chain is read again at every check, so a program that comes to run ahead of ours (a
//! CNI restarted, attached first) is said once when it appears.
use anyhow::Result;

use super::attach::Sampler;
use super::chain::{self, Chain, Ours};
use super::AttachInfo;
use crate::analysis::records::HookStatus;
use crate::sys::netns::{self, NetNs};
use crate::sys::rtnl::Rtnl;

/// An interval in which an interface moved more packets than this in one direction while the
/// sampler's hook saw none makes the hook blind (a few ARP or neighbour packets that a
/// datapath answers before tc do not).
pub const BLIND_MIN_PACKETS: u64 = 10;

const DIRECTIONS: [&str; 2] = ["ingress", "egress"];

/// One interface's two hooks.
struct Watched {
    label: String,
    netns: String,
    iface: String,
    how: String,
    ns: Option<NetNs>,
    ifindex: u32,
    /// (netns inode, ifindex): the interface in the view's `attach_info`.
    key: (u32, u32),
    /// A socket in its namespace, opened at start (it stays there after privileges drop).
    rtnl: Option<Rtnl>,
    ours: [Ours; 2],
    /// The kernel's counts (received, sent) and our hooks' at attach and at the last check.
    kernel_start: [u64; 2],
    kernel_last: [u64; 2],
    hook_last: [u64; 2],
    status: [HookStatus; 2],
    /// Re-reading the chain failed (e.g. no CAP_SYS_ADMIN left to enter the namespace): said once.
    chain_failed: bool,
}

/// The sampler's hooks, checked once per interval.
pub struct HookWatch {
    ifaces: Vec<Watched>,
    notices: Vec<String>,
}

fn ours_of(a: &AttachInfo, ids: [u32; 2]) -> [Ours; 2] {
    let one = |id| match a.priority {
        Some(p) => Ours::Clsact(p),
        None => Ours::Tcx(id),
    };
    [one(ids[0]), one(ids[1])]
}

/// Both hooks' chains, read inside the namespace.
fn chains(ns: Option<&NetNs>, ifindex: u32) -> Result<[Chain; 2]> {
    let read = move || {
        let mut r = Rtnl::open()?;
        Ok([
            chain::read(&mut r, ifindex, false)?,
            chain::read(&mut r, ifindex, true)?,
        ])
    };
    match ns {
        Some(ns) => netns::scoped(ns, read),
        None => read(),
    }
}

impl HookWatch {
    /// The attached interfaces, their counters now, and what runs ahead of each hook (said at
    /// once, in [`HookWatch::take_notices`]).
    pub(crate) fn new(view: &Sampler) -> HookWatch {
        let mut w = HookWatch {
            ifaces: Vec::new(),
            notices: Vec::new(),
        };
        w.sync(view);
        w
    }

    /// Follow the view's interfaces (`--iface` patterns): watch those attached since, forget
    /// those released.
    pub(crate) fn sync(&mut self, view: &Sampler) {
        let infos = view.attach_info();
        let key = |a: &AttachInfo| (a.netns_inode, a.ifindex);
        let now: std::collections::BTreeSet<_> = infos.iter().map(key).collect();
        self.ifaces.retain(|w| now.contains(&w.key));
        if self.ifaces.len() == infos.len() {
            return;
        }
        let known: std::collections::BTreeSet<_> = self.ifaces.iter().map(|w| w.key).collect();
        let hooks = view.hook_packets().unwrap_or_default();
        let ids = view.hook_prog_ids();
        for (i, a) in infos.iter().enumerate() {
            if known.contains(&key(a)) {
                continue;
            }
            let ids = ids.get(i).copied().unwrap_or_default();
            let hooks = hooks.get(i).copied().unwrap_or_default();
            let it = Watched::start(a, ids, hooks, &mut self.notices);
            self.ifaces.push(it);
        }
    }

    /// One interval: compare every hook with its interface, re-read the chains; notices for
    /// what changed.
    pub(crate) fn check(&mut self, view: &Sampler) {
        let hooks = view.hook_packets().unwrap_or_default();
        let by_key: std::collections::BTreeMap<_, _> = view
            .attach_info()
            .iter()
            .zip(hooks)
            .map(|(a, h)| ((a.netns_inode, a.ifindex), h))
            .collect();
        for it in self.ifaces.iter_mut() {
            let Some(h) = by_key.get(&it.key).copied() else {
                continue;
            };
            let Some(k) = it.kernel_now() else {
                continue; // gone, or no socket: the session's watch says so
            };
            it.recheck_chain(&mut self.notices);
            for d in 0..2 {
                it.interval(d, h[d], k[d], &mut self.notices);
            }
            (it.hook_last, it.kernel_last) = (h, k);
        }
    }

    /// Every hook's state at the last check.
    pub fn statuses(&self) -> Vec<HookStatus> {
        self.ifaces
            .iter()
            .flat_map(|i| i.status.iter().cloned())
            .collect()
    }

    /// What to say since the last call (one line each).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }
}

impl Watched {
    /// Start watching one attached interface: its counters now, what runs ahead of its hooks.
    fn start(a: &AttachInfo, ids: [u32; 2], hooks: [u64; 2], notices: &mut Vec<String>) -> Watched {
        let ns = netns::resolve(&a.netns)
            .ok()
            .filter(|n| n.inode == a.netns_inode);
        let rtnl = match &ns {
            Some(ns) => netns::run_in(ns, Rtnl::open).ok(),
            None => None,
        };
        let mut it = Watched {
            label: if a.netns == "self" {
                a.iface.clone()
            } else {
                format!("{}:{}", a.netns, a.iface)
            },
            netns: a.netns.clone(),
            iface: a.iface.clone(),
            how: a.how.clone(),
            ns,
            ifindex: a.ifindex,
            key: (a.netns_inode, a.ifindex),
            rtnl,
            ours: ours_of(a, ids),
            kernel_start: [0; 2],
            kernel_last: [0; 2],
            hook_last: hooks,
            status: Default::default(),
            chain_failed: false,
        };
        it.kernel_start = it.kernel_now().unwrap_or_default();
        it.kernel_last = it.kernel_start;
        for d in 0..2 {
            it.status[d] = it.status_base(d);
        }
        it.recheck_chain(notices);
        it
    }

    /// The interface's counts now: (received, sent).
    fn kernel_now(&mut self) -> Option<[u64; 2]> {
        let l = self.rtnl.as_mut()?.link(self.ifindex).ok()??;
        Some([l.rx_packets, l.tx_packets])
    }

    fn status_base(&self, d: usize) -> HookStatus {
        HookStatus {
            view: "sampler".into(),
            netns: self.netns.clone(),
            iface: self.iface.clone(),
            direction: DIRECTIONS[d].into(),
            how: self.how.clone(),
            ..HookStatus::default()
        }
    }

    /// Read both chains again; say what newly runs ahead of a hook.
    fn recheck_chain(&mut self, notices: &mut Vec<String>) {
        let chains = match chains(self.ns.as_ref(), self.ifindex) {
            Ok(c) => c,
            Err(e) => {
                if !self.chain_failed {
                    self.chain_failed = true;
                    notices.push(format!(
                        "cannot read what runs on {}'s tc hooks besides the sampler ({}); the blind check goes on without naming a cause",
                        self.label,
                        crate::error::sentence(&e)
                    ));
                }
                return;
            }
        };
        for (d, c) in chains.iter().enumerate() {
            let ahead = c.ahead(self.ours[d]);
            if ahead != self.status[d].ahead {
                let pinned = c.pinned_first(self.ours[d]);
                notices.extend(chain::ahead_sentence(
                    &self.label,
                    DIRECTIONS[d],
                    &ahead,
                    pinned,
                ));
                self.status[d].ahead = ahead;
            }
        }
    }

    /// One direction's interval: `hook`, `kernel` its cumulative counts now.
    fn interval(&mut self, d: usize, hook: u64, kernel: u64, notices: &mut Vec<String>) {
        let s = &mut self.status[d];
        let dh = hook.saturating_sub(self.hook_last[d]);
        let dk = kernel.saturating_sub(self.kernel_last[d]);
        s.hook_packets = hook;
        s.iface_packets = kernel.saturating_sub(self.kernel_start[d]);
        s.interval_hook_packets = dh;
        s.interval_iface_packets = dk;
        let blind = dh == 0 && dk > BLIND_MIN_PACKETS;
        let verb = if d == 0 { "received" } else { "sent" };
        if blind && !s.blind {
            let cause = if s.ahead.is_empty() {
                "nothing that rttscope can see runs ahead of it: a datapath that moves packets past this hook (bpf_redirect_peer, bpf_redirect to another device's ingress), or a program attached since the last check".to_string()
            } else {
                format!(
                    "likely cause: {} runs ahead of it and ends the chain",
                    s.ahead.join(", ")
                )
            };
            notices.push(format!(
                "the sampler is blind on {} {}: its hook saw no packet in the last interval while the interface {verb} {dk}; {cause}",
                self.label, DIRECTIONS[d]
            ));
        } else if !blind && s.blind && dh > 0 {
            notices.push(format!(
                "the sampler sees packets on {} {} again ({dh} in the last interval)",
                self.label, DIRECTIONS[d]
            ));
        }
        if blind || dh > 0 {
            s.blind = blind; // a quiet interval keeps the last verdict
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> Watched {
        let mut w = Watched {
            label: "ns:veth0".into(),
            netns: "ns".into(),
            iface: "veth0".into(),
            how: "tcx".into(),
            ns: None,
            ifindex: 2,
            key: (1, 2),
            rtnl: None,
            ours: [Ours::Tcx(1), Ours::Tcx(2)],
            kernel_start: [100, 100],
            kernel_last: [100, 100],
            hook_last: [0, 0],
            status: Default::default(),
            chain_failed: false,
        };
        w.status = [w.status_base(0), w.status_base(1)];
        w
    }

    #[test]
    fn a_hook_that_sees_nothing_while_the_interface_moves_is_blind() {
        let mut w = watched();
        let mut n = Vec::new();
        // 10 packets or fewer: not enough to say
        w.interval(0, 0, 110, &mut n);
        assert!(!w.status[0].blind && n.is_empty());
        w.kernel_last[0] = 110;
        w.status[0].ahead = vec!["clsact filter bpf cni (id 7, priority 1)".into()];
        w.interval(0, 0, 500, &mut n);
        assert!(w.status[0].blind);
        assert_eq!(w.status[0].interval_iface_packets, 390);
        assert_eq!(w.status[0].iface_packets, 400);
        assert_eq!(n.len(), 1);
        assert!(
            n[0].contains("ns:veth0 ingress") && n[0].contains("cni"),
            "{n:?}"
        );
        assert!(n[0].contains("received 390"), "{n:?}");
        // said once while it stays blind
        w.kernel_last[0] = 500;
        w.interval(0, 0, 900, &mut n);
        assert_eq!(n.len(), 1);
        // seeing packets again is said, and clears the flag
        w.kernel_last[0] = 900;
        w.interval(0, 50, 960, &mut n);
        assert!(!w.status[0].blind);
        assert!(n[1].contains("again"), "{n:?}");
        // egress, nothing ahead: the sentence says what else it can be
        w.interval(1, 0, 200, &mut n);
        assert!(w.status[1].blind);
        assert!(
            n[2].contains("egress") && n[2].contains("bpf_redirect_peer"),
            "{n:?}"
        );
        assert!(n.iter().all(|l| !l.contains('\n')));
    }
}
