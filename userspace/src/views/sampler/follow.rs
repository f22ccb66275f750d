//! The sampler's interfaces as they come and go (issue 41.5): every interface it is attached
//! to ([`Ifaces`], shared with the reading thread), attached and released one at a time with
//! the programs loaded once per namespace and link type ([`Group`]); and, for an `--iface`
//! pattern (`veth*`, `lxc*`), a thread per namespace ([`Follower`]) that listens to the
//! namespace's interface notifications (rtnetlink RTMGRP_LINK, `sys::rtnl::LinkEvents`) and
//! attaches a new matching interface as soon as it is announced, releases a deleted one, and
//! refuses (and counts) those beyond the observer's bound (`--max-ifaces`).
//!
//! Accounting: every matching interface seen is counted once, as `ifaces_attached`,
//! `ifaces_refused` (over the bound) or `ifaces_unattachable` (the attach failed, mostly
//! because it was deleted before its turn came, or a link type without a loaded program);
//! `ifaces_released` counts the attached ones that vanished; `ifaces_live` those attached now.
use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};

use super::hook_tags::{self, HookTags};
use super::tc::Attachments;
use super::{attach_info, link_of, AttachInfo, AttachMode, IfaceMeta, IfaceSpec, ResolvedIface};
use crate::bpf::sampler::types as t;
use crate::sys::netns::{self, NetNs};
use crate::sys::rtnl::{LinkEvent, LinkEvents, LinkName, Rtnl};

/// One loaded copy of the programs: the namespace and link type it serves, its two programs
/// (ingress, egress: duplicates of the loader's descriptors) and their ids.
pub(super) struct Group {
    pub ns_inode: u32,
    pub link: t::rttscope_sampler_link,
    pub progs: [OwnedFd; 2],
    pub ids: [u32; 2],
}

/// What attaching needs, shared by the reading thread and the followers.
pub(super) struct Ctx {
    pub groups: Vec<Group>,
    /// `sampler_hooks` (each hook's key and packets, per CPU): a duplicate descriptor.
    pub hooks: OwnedFd,
    pub mode: AttachMode,
    pub max: usize,
}

/// One attached interface.
pub(super) struct Live {
    pub info: AttachInfo,
    pub ids: [u32; 2],
    /// Its hooks' entries in `sampler_hooks`, `[ingress, egress]`.
    hooks: [u32; 2],
    /// Held for its Drop: detaches (tcx links close, clsact filters removed).
    attached: Attachments,
}

/// The attached interfaces and the counts of those that came and went.
pub(super) struct Ifaces {
    /// In the order attached.
    pub live: Vec<Live>,
    pub attached: u64,
    pub released: u64,
    pub refused: u64,
    pub unattachable: u64,
    /// What the hooks of released interfaces saw: `[ingress, egress]`.
    pub released_hooks: [u64; 2],
    /// Interfaces refused or unattachable while they exist: not counted again.
    passed: BTreeSet<(u32, u32)>,
    said_refused: bool,
    said_unattachable: bool,
    /// Lines to print (the session's notices).
    pub notices: Vec<String>,
    /// Moves on at every change of `live`.
    pub version: u64,
    /// Which entry of `sampler_hooks` each hook has.
    tags: HookTags,
}

/// A hook's packets since it was entered, summed over CPUs.
fn hook_sum(ctx: &Ctx, netns: u32, ifindex: u32, dir: usize, entry: u32) -> io::Result<u64> {
    let mut v = vec![0u8; hook_tags::ENTRY_BYTES * crate::sys::bpf::possible_cpus()?];
    crate::sys::bpf::lookup(ctx.hooks.as_fd(), &entry.to_ne_bytes(), &mut v)?;
    Ok(hook_tags::packets(&v, hook_tags::key(netns, ifindex, dir)))
}

/// Write an entry of `sampler_hooks` on every CPU: `key` with a count of 0.
fn write_entry(ctx: &Ctx, entry: u32, key: u64) -> Result<()> {
    let v = hook_tags::entry_bytes(key, crate::sys::bpf::possible_cpus()?);
    crate::sys::bpf::update(ctx.hooks.as_fd(), Some(&entry.to_ne_bytes()), &v, 0)
        .context("entering its hook counters")
}

impl Ifaces {
    /// For at most `max` interfaces (2 hook counters each).
    pub(super) fn new(max: u32) -> Ifaces {
        Ifaces {
            live: Vec::new(),
            attached: 0,
            released: 0,
            refused: 0,
            unattachable: 0,
            released_hooks: [0; 2],
            passed: BTreeSet::new(),
            said_refused: false,
            said_unattachable: false,
            notices: Vec::new(),
            version: 0,
            tags: HookTags::new(2 * max),
        }
    }

    /// Enter an interface's two hooks (the programs count their packets from then on).
    /// Nothing is left entered on an error.
    fn place_hooks(&mut self, ctx: &Ctx, ns: u32, ifindex: u32) -> Result<[u32; 2]> {
        let mut placed = Vec::with_capacity(2);
        for d in 0..2 {
            let key = hook_tags::key(ns, ifindex, d);
            let r = self.tags.place(key).and_then(|e| {
                placed.push(e);
                write_entry(ctx, e, key)
            });
            if let Err(e) = r {
                self.unplace_hooks(ctx, &placed);
                return Err(e);
            }
        }
        Ok([placed[0], placed[1]])
    }

    /// Let hooks go: their entries marked released in the map, then in the table.
    fn unplace_hooks(&mut self, ctx: &Ctx, entries: &[u32]) {
        for &e in entries {
            let _ = write_entry(ctx, e, hook_tags::RELEASED);
            self.tags.release(e);
        }
    }

    fn position(&self, netns: u32, ifindex: u32) -> Option<usize> {
        self.live
            .iter()
            .position(|l| l.info.netns_inode == netns && l.info.ifindex == ifindex)
    }

    /// Attach one interface: refused (counted) beyond the bound; Err if the attach failed
    /// (nothing left of it).
    pub(super) fn attach(
        &mut self,
        ctx: &Ctx,
        r: &ResolvedIface,
        pattern: Option<&IfaceSpec>,
    ) -> Result<()> {
        let (ns, ifindex) = (r.ns.inode, r.meta.ifindex);
        if self.live.len() >= ctx.max {
            self.refused += 1;
            self.passed.insert((ns, ifindex));
            if !self.said_refused {
                self.said_refused = true;
                self.notices.push(format!(
                    "the sampler is attached to {} interfaces, its bound (--max-ifaces): {} and any further interface is refused and counted (ifaces_refused)",
                    ctx.max, r.spec
                ));
            }
            return Ok(());
        }
        let Some(g) = ctx
            .groups
            .iter()
            .find(|g| g.ns_inode == ns && g.link == r.link)
        else {
            anyhow::bail!(
                "no sampler program was loaded for its link type ({}); interfaces of that type are attached when one matches at start",
                r.meta.arphrd
            );
        };
        let hooks = self.place_hooks(ctx, ns, ifindex)?;
        let mut attached = Attachments::default();
        let progs = [g.progs[0].as_fd(), g.progs[1].as_fd()];
        let (how, priority) = match super::attach::attach_iface(progs, r, ctx.mode, &mut attached) {
            Ok(h) => h,
            Err(e) => {
                drop(attached);
                self.unplace_hooks(ctx, &hooks);
                return Err(e);
            }
        };
        let mut info = attach_info(&r.spec, &r.ns, ifindex, how, r.link);
        info.priority = priority;
        info.pattern = pattern.map(|p| p.to_string());
        self.live.push(Live {
            info,
            ids: g.ids,
            hooks,
            attached,
        });
        self.attached += 1;
        self.version += 1;
        Ok(())
    }

    /// A matching interface that could not be attached: counted once, said the first time.
    pub(super) fn unattachable(&mut self, ns: u32, ifindex: u32, name: &str, e: &anyhow::Error) {
        self.unattachable += 1;
        self.passed.insert((ns, ifindex));
        if !self.said_unattachable {
            self.said_unattachable = true;
            self.notices.push(format!(
                "the sampler could not attach to {name} ({}); such interfaces are counted (ifaces_unattachable) and the rest goes on",
                crate::error::sentence(e)
            ));
        }
    }

    /// Release an attached interface: its hooks' counts kept in `released_hooks`, its keys
    /// deleted; `gone`: the device no longer exists (its tcx links and clsact filters went
    /// with it: nothing to remove over netlink).
    pub(super) fn release(&mut self, ctx: &Ctx, netns: u32, ifindex: u32, gone: bool) {
        let Some(i) = self.position(netns, ifindex) else {
            return;
        };
        let l = self.live.remove(i);
        if gone {
            l.attached.device_gone();
        } else {
            drop(l.attached); // detached before its counts are taken: none come later
        }
        for (d, &e) in l.hooks.iter().enumerate() {
            if let Ok(n) = hook_sum(ctx, netns, ifindex, d, e) {
                self.released_hooks[d] += n;
            }
        }
        self.unplace_hooks(ctx, &l.hooks);
        self.released += 1;
        self.version += 1;
    }

    /// The packets each attached interface's hooks saw, `[ingress, egress]`, in `live`'s order.
    pub(super) fn hook_sums(&self, ctx: &Ctx) -> Vec<[u64; 2]> {
        self.live
            .iter()
            .map(|l| {
                let one = |d: usize| {
                    hook_sum(ctx, l.info.netns_inode, l.info.ifindex, d, l.hooks[d]).unwrap_or(0)
                };
                [one(0), one(1)]
            })
            .collect()
    }

    /// Detach everything (before the programs go).
    pub(super) fn clear(&mut self) {
        self.live.clear();
    }
}

/// Lock, shrugging off poisoning (a panicked follower must not stop the reads).
pub(super) fn lock(m: &Mutex<Ifaces>) -> MutexGuard<'_, Ifaces> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The interfaces of a namespace that the patterns match, as the kernel lists them.
pub(super) fn matching(links: &[LinkName], patterns: &[IfaceSpec]) -> Vec<LinkName> {
    links
        .iter()
        .filter(|l| patterns.iter().any(|p| p.matches(&l.name)))
        .cloned()
        .collect()
}

/// One interface a pattern of namespace `ns` matched, resolved as `--iface` resolves a name.
pub(super) fn resolved(ns: &NetNs, spec_ns: Option<&str>, l: &LinkName) -> Result<ResolvedIface> {
    let spec = IfaceSpec {
        netns: spec_ns.map(str::to_string),
        name: l.name.clone(),
    };
    let link = link_of(&spec, l.arphrd)?;
    Ok(ResolvedIface {
        spec,
        ns: ns.clone(),
        meta: IfaceMeta {
            ifindex: l.ifindex,
            arphrd: l.arphrd,
        },
        link,
    })
}

/// The thread following one namespace's interfaces for its patterns; stopped and joined on drop.
pub(super) struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one follower watches.
pub(super) struct Watch {
    pub ns: NetNs,
    /// The patterns of this namespace (all with the same NETNS part).
    pub patterns: Vec<IfaceSpec>,
    /// Subscribed before the interfaces were first listed: nothing created in between is missed.
    pub events: LinkEvents,
}

/// How long a follower waits for notifications before looking at its stop flag.
const POLL: Duration = Duration::from_millis(100);

impl Follower {
    pub(super) fn spawn(ctx: Arc<Ctx>, ifaces: Arc<Mutex<Ifaces>>, mut w: Watch) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rttscope-follow".into())
            .spawn(move || {
                if !netns::is_current(&w.ns) {
                    if let Err(e) = netns::enter_path(&w.ns.path, &w.ns.name) {
                        lock(&ifaces).notices.push(format!(
                            "cannot follow the interfaces of namespace {} ({e}); those attached at start stay",
                            w.ns.name
                        ));
                        return;
                    }
                }
                // the daemon switches to uid 65534 after its start: this thread keeps what
                // attaching needs (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON) and, until the switch,
                // what the switch needs; nothing more
                let mut switched = !crate::sys::caps::is_root();
                if !switched {
                    if let Err(e) = crate::sys::caps::keep_needed_across_user_switch() {
                        tracing::info!("follower capabilities: {e:#}");
                    }
                }
                while !flag.load(Ordering::Relaxed) {
                    if !switched {
                        switched = crate::sys::caps::after_user_switch().unwrap_or(true);
                    }
                    match w.events.next(POLL) {
                        Ok(evs) => on_events(&ctx, &ifaces, &w, evs),
                        Err(e) => {
                            lock(&ifaces).notices.push(format!(
                                "stopped following the interfaces of namespace {}: {}",
                                w.ns.name,
                                crate::error::sentence(&e)
                            ));
                            return;
                        }
                    }
                }
            })
            .ok();
        Follower { stop, thread }
    }
}

/// Apply a batch of notifications.
fn on_events(ctx: &Ctx, ifaces: &Mutex<Ifaces>, w: &Watch, evs: Vec<LinkEvent>) {
    if evs.is_empty() {
        return;
    }
    let _ = crate::sys::caps::raise_effective();
    let spec_ns = w.patterns.first().and_then(|p| p.netns.clone());
    let ns = w.ns.inode;
    for ev in evs {
        match ev {
            LinkEvent::New(l) => {
                let Some(p) = w.patterns.iter().find(|p| p.matches(&l.name)) else {
                    continue;
                };
                let mut st = lock(ifaces);
                if st.position(ns, l.ifindex).is_some() || st.passed.contains(&(ns, l.ifindex)) {
                    continue; // a change of one already seen
                }
                let r = resolved(&w.ns, spec_ns.as_deref(), &l)
                    .and_then(|r| st.attach(ctx, &r, Some(p)));
                if let Err(e) = r {
                    st.unattachable(ns, l.ifindex, &l.name, &e);
                }
            }
            LinkEvent::Gone(l) => {
                let mut st = lock(ifaces);
                st.passed.remove(&(ns, l.ifindex));
                let followed = st
                    .position(ns, l.ifindex)
                    .is_some_and(|i| st.live[i].info.pattern.is_some());
                if followed {
                    st.release(ctx, ns, l.ifindex, true);
                }
            }
            LinkEvent::Lost => resync(ctx, ifaces, w),
        }
    }
}

/// Notifications were lost: list the interfaces again, attach the new matches, release the
/// followed ones no longer there.
fn resync(ctx: &Ctx, ifaces: &Mutex<Ifaces>, w: &Watch) {
    let Ok(links) = Rtnl::open().and_then(|mut r| r.links()) else {
        return;
    };
    let ns = w.ns.inode;
    let present: BTreeSet<u32> = links.iter().map(|l| l.ifindex).collect();
    {
        let mut st = lock(ifaces);
        let gone: Vec<u32> = st
            .live
            .iter()
            .filter(|l| l.info.netns_inode == ns && l.info.pattern.is_some())
            .map(|l| l.info.ifindex)
            .filter(|i| !present.contains(i))
            .collect();
        for i in gone {
            st.release(ctx, ns, i, true);
        }
        st.passed.retain(|(n, i)| *n != ns || present.contains(i));
    }
    let news = matching(&links, &w.patterns)
        .into_iter()
        .map(LinkEvent::New)
        .collect();
    on_events(ctx, ifaces, w, news);
}
