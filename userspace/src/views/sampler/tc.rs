//! Attaching the sampler's programs (libbpf loader; aya's clsact too): tcx links, or clsact
//! filters where tcx is unavailable or clsact is asked for.
//!
//! clsact filters do not die with their process, and several observers may
//! share one interface, so each observer first **claims a slot** on the
//! interface: slot `k` is filter handle and priority `CLSACT_HANDLE + k`
//! (`0x7273..0x72b2`), and the claim is an abstract unix socket
//! `rttscope-sampler-clsact-<ifindex>-<k>` bound in the interface's network
//! namespace. The kernel releases the socket when its process exits, even on
//! `kill -9`, and a bind fails while it is held, so:
//!
//! - a slot whose name cannot be bound belongs to a live observer: its
//!   filters are never touched;
//! - a filter of ours (program named `rtt_sampler_*`) in a slot whose name
//!   we could bind was left by a dead observer and is removed, unless some
//!   process still holds its program (`prog_id:` in `/proc/*/fdinfo`: e.g. an
//!   older rttscope that claimed nothing);
//! - a filter of another program in a slot makes that slot unusable.
//!
//! The priority of a slot's filters is chosen at the claim ([`clsact_priority`]): one below
//! the lowest priority of the other filters on the interface, so ours run before a CNI's
//! filter that ends the chain, unless that filter sits at priority 1 (nothing can precede it:
//! the run says so). Several observers may share one priority (their handles differ).
//!
//! The clsact qdisc is removed by the last observer to leave, if an observer
//! created it (each holds a second name, `...-<k>-qdisc`, while it knows the
//! qdisc to be rttscope's); a qdisc that existed before is left alone.
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use anyhow::{Context, Result};

use super::{CLSACT_HANDLE, CLSACT_PRIORITY};
use crate::sys::netns::{self, NetNs};
use crate::sys::rtnl::{Rtnl, TcFilter};

/// Slots per interface: observers that can share one interface in clsact mode.
pub(super) const CLSACT_SLOTS: u32 = 64;

pub(super) enum Attached {
    /// A tcx link: closing the fd detaches it.
    Tcx(#[allow(dead_code)] OwnedFd),
    /// A clsact filter in our slot: removed explicitly on drop.
    #[cfg(feature = "libbpf")]
    Clsact {
        ns: NetNs,
        ifindex: u32,
        egress: bool,
        slot: u32,
        priority: u16,
    },
    /// Our claim on a clsact slot of an interface (before its filters in the
    /// list; released after them).
    #[cfg(feature = "libbpf")]
    Claim { ns: NetNs, claim: ClsactClaim },
}

/// Our attachments; dropping them detaches (also on an error half-way
/// through `attach`, so a failed start leaves no clsact filter behind).
#[derive(Default)]
pub(super) struct Attachments(pub(super) Vec<Attached>);

impl Attachments {
    /// The interface was deleted: its tcx links and clsact filters went with it, so nothing
    /// is removed over netlink (that would only fail); the link descriptors and slot claims
    /// are closed.
    pub(super) fn device_gone(mut self) {
        self.0.clear();
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        #[cfg(feature = "libbpf")]
        clsact_release(&mut self.0);
        self.0.clear(); // tcx link fds close here
    }
}

/// Remove our clsact filters, then the qdisc if we are the last observer of
/// a qdisc an observer created, then release our claims.
#[cfg(feature = "libbpf")]
fn clsact_release(list: &mut Vec<Attached>) {
    let mut claims = Vec::new();
    for a in list.drain(..) {
        match a {
            Attached::Clsact {
                ns,
                ifindex,
                egress,
                slot,
                priority,
            } => {
                let detach = move || clsact_detach(ifindex, egress, slot, priority);
                if let Err(e) = netns::run_in(&ns, detach) {
                    tracing::warn!("removing clsact filter (ifindex {ifindex}): {e:#}");
                }
            }
            Attached::Claim { ns, claim } => claims.push((ns, claim)),
            Attached::Tcx(_) => {} // the link fd closes here
        }
    }
    // our filters are gone: now the qdisc (if we are the last observer
    // of a qdisc an observer created), then the claim itself
    for (ns, claim) in claims {
        let (ifindex, slot, marked) = (claim.ifindex, claim.slot, claim.qdisc.is_some());
        if marked {
            let r = netns::run_in(&ns, move || {
                if other_observers(ifindex, slot) {
                    return Ok(());
                }
                clsact_qdisc_destroy(ifindex)
            });
            if let Err(e) = r {
                tracing::warn!("removing clsact qdisc (ifindex {ifindex}): {e:#}");
            }
        }
        drop(claim);
    }
}

/// One observer's slot on one interface, held while its filters are there.
pub(super) struct ClsactClaim {
    pub(super) ifindex: u32,
    pub(super) slot: u32,
    /// The priority of our filters: ahead of the other filters where one is free
    /// ([`clsact_priority`]).
    pub(super) priority: u16,
    /// Bound to the slot's name: the proof that we are alive.
    _name: UnixDatagram,
    /// Bound to the slot's qdisc name while we know the clsact qdisc to be
    /// rttscope's (we created it, or joined an observer that knew).
    qdisc: Option<UnixDatagram>,
}

fn slot_name(ifindex: u32, slot: u32) -> String {
    format!("rttscope-sampler-clsact-{ifindex}-{slot}")
}

fn qdisc_name(ifindex: u32, slot: u32) -> String {
    format!("rttscope-sampler-clsact-{ifindex}-{slot}-qdisc")
}

/// Bind an abstract unix socket name in the current network namespace;
/// `Ok(None)` if a live process holds it.
fn bind_name(name: &str) -> Result<Option<UnixDatagram>> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    match UnixDatagram::bind_addr(&addr) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(e).with_context(|| format!("binding the abstract socket @{name}")),
    }
}

/// Whether a live process holds one of the names `name(k)`, k != `slot`.
fn any_held(ifindex: u32, slot: u32, name: fn(u32, u32) -> String) -> bool {
    (0..CLSACT_SLOTS)
        .filter(|&k| k != slot)
        .any(|k| matches!(bind_name(&name(ifindex, k)), Ok(None)))
}

/// Another live observer has a slot on this interface.
fn other_observers(ifindex: u32, slot: u32) -> bool {
    any_held(ifindex, slot, slot_name)
}

/// Attach `prog` as a tcx link at the ingress or egress of `ifindex` (in
/// the calling thread's namespace), at the **head** of the chain
/// (`BPF_F_BEFORE` with no relative program: issue 41): it runs before the
/// programs already there (a CNI's, which may end the chain), and since it
/// returns `TCX_NEXT` they all run after it as before. One
/// `BPF_LINK_CREATE`, whichever loader loaded the program.
pub(super) fn tcx_attach(prog: BorrowedFd<'_>, ifindex: u32, egress: bool) -> Result<OwnedFd> {
    use crate::sys::bpfprog::{link_create_flags, LINK_BEFORE};
    Ok(link_create_flags(
        &prog,
        ifindex,
        tcx_attach_type(egress),
        LINK_BEFORE,
    )?)
}

/// The tcx attach type of a direction.
pub(super) fn tcx_attach_type(egress: bool) -> u32 {
    use crate::sys::bpfprog::{ATTACH_TCX_EGRESS, ATTACH_TCX_INGRESS};
    if egress {
        ATTACH_TCX_EGRESS
    } else {
        ATTACH_TCX_INGRESS
    }
}

#[cfg(feature = "libbpf")]
fn clsact_hook(
    prog_fd: BorrowedFd<'_>,
    ifindex: u32,
    egress: bool,
    (slot, priority): (u32, u16),
) -> libbpf_rs::TcHook {
    let mut b = libbpf_rs::TcHookBuilder::new(prog_fd);
    // never replace: our slot is empty when we attach (a filter that appeared
    // there meanwhile makes the attach fail rather than be clobbered)
    b.ifindex(ifindex as i32)
        .replace(false)
        .handle(CLSACT_HANDLE + slot)
        .priority(priority as u32);
    b.hook(if egress {
        libbpf_rs::TC_EGRESS
    } else {
        libbpf_rs::TC_INGRESS
    })
}

#[cfg(feature = "libbpf")]
/// Whether a process we can see holds an fd of program `id` (as bpftool
/// finds a program's holders: `prog_id:` in `/proc/PID/fdinfo/FD`).
fn prog_held(id: u32) -> bool {
    let want = format!("prog_id:\t{id}");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    for p in procs.flatten() {
        let pid = p.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_prog = std::fs::read_link(fd.path())
                .map(|t| t.as_os_str() == "anon_inode:bpf-prog")
                .unwrap_or(false);
            if !is_prog {
                continue;
            }
            let info = p.path().join("fdinfo").join(fd.file_name());
            if let Ok(text) = std::fs::read_to_string(info) {
                if text.lines().any(|l| l == want) {
                    return true;
                }
            }
        }
    }
    false
}

/// Whether a clsact filter is one of rttscope's (libbpf names it `<program name>:[<id>]`).
pub(super) fn is_ours(f: &TcFilter) -> bool {
    f.kind == "bpf"
        && f.name
            .as_deref()
            .is_some_and(|n| n.starts_with("rtt_sampler_"))
}

/// The priority our filters in `slot` take, given the filters on both hooks of the interface:
/// one less than the lowest priority of the other filters, so that ours run first (issue 41);
/// the slot's own (`CLSACT_PRIORITY + slot`) when no other filter comes before that, or when
/// the lowest is 1, which nothing can precede (tc reads priority 0 as "choose one").
pub(super) fn clsact_priority(filters: &[TcFilter], slot: u32) -> u16 {
    let own = (CLSACT_PRIORITY + slot) as u16;
    let lowest = filters
        .iter()
        .filter(|f| !is_ours(f))
        .map(|f| f.priority)
        .min();
    match lowest {
        Some(l) if l <= own && l > 1 => l - 1,
        _ => own,
    }
}

#[cfg(feature = "libbpf")]
/// The filter in `slot` of a hook (by its handle, at whatever priority it took): `Some((prog
/// id, name, priority))`.
fn slot_filter(filters: &[TcFilter], slot: u32) -> Option<(u32, String, u16)> {
    filters
        .iter()
        .find(|f| f.handle == CLSACT_HANDLE + slot)
        .map(|f| {
            let name = if f.kind == "bpf" {
                f.name.clone().unwrap_or_default()
            } else {
                f.kind.clone()
            };
            (f.prog_id.unwrap_or(0), name, f.priority)
        })
}

#[cfg(feature = "libbpf")]
/// Claim a slot on `ifindex` for our filters, removing on the way the
/// filters of ours that dead observers left in any free slot, and make sure
/// the clsact qdisc exists. Runs inside the interface's namespace.
pub(super) fn clsact_claim(ifindex: u32) -> Result<ClsactClaim> {
    let mut rtnl = Rtnl::open()?;
    let mut mine = None;
    for k in 0..CLSACT_SLOTS {
        // held: a live observer's slot, whatever is in it stays
        let Some(name) = bind_name(&slot_name(ifindex, k))? else {
            continue;
        };
        let mut usable = true;
        for egress in [true, false] {
            let filters = rtnl.filters(ifindex, egress)?;
            match slot_filter(&filters, k) {
                None => {}
                Some((id, n, prio)) if n.starts_with("rtt_sampler_") => {
                    if prog_held(id) {
                        // alive without a claim (an older rttscope): leave it
                        usable = false;
                        continue;
                    }
                    clsact_detach(ifindex, egress, k, prio)
                        .context("removing a stale rttscope clsact filter")?;
                    tracing::info!(
                        "removed a stale rttscope clsact filter (ifindex {ifindex}, handle {:#x})",
                        CLSACT_HANDLE + k
                    );
                }
                Some((_, n, _)) => {
                    tracing::info!(
                        "a foreign tc filter ({n}) sits at handle {:#x}; not using that slot",
                        CLSACT_HANDLE + k
                    );
                    usable = false;
                }
            }
        }
        if usable && mine.is_none() {
            mine = Some((k, name));
        }
    }
    let Some((slot, name)) = mine else {
        anyhow::bail!(
            "no free clsact slot (handles {CLSACT_HANDLE:#x}..{:#x}) on ifindex {ifindex}",
            CLSACT_HANDLE + CLSACT_SLOTS - 1
        );
    };
    let created = clsact_qdisc_create(ifindex)?;
    // rttscope's qdisc: we created it, or an observer that knows holds its name
    let qdisc = if created || any_held(ifindex, slot, qdisc_name) {
        bind_name(&qdisc_name(ifindex, slot))?
    } else {
        None
    };
    let mut all = rtnl.filters(ifindex, false)?;
    all.extend(rtnl.filters(ifindex, true)?);
    Ok(ClsactClaim {
        ifindex,
        slot,
        priority: clsact_priority(&all, slot),
        _name: name,
        qdisc,
    })
}

#[cfg(feature = "libbpf")]
fn qdisc_hook(ifindex: u32) -> libbpf_rs::libbpf_sys::bpf_tc_hook {
    libbpf_rs::libbpf_sys::bpf_tc_hook {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_tc_hook>() as _,
        ifindex: ifindex as i32,
        attach_point: libbpf_rs::libbpf_sys::BPF_TC_INGRESS | libbpf_rs::libbpf_sys::BPF_TC_EGRESS,
        ..Default::default()
    }
}

#[cfg(feature = "libbpf")]
/// Create the clsact qdisc if missing; true if we created it.
fn clsact_qdisc_create(ifindex: u32) -> Result<bool> {
    let mut h = qdisc_hook(ifindex);
    // SAFETY: a valid, fully initialised hook description.
    let r = unsafe { libbpf_rs::libbpf_sys::bpf_tc_hook_create(&mut h) };
    match -r {
        0 => Ok(true),
        libc::EEXIST => Ok(false),
        e => Err(std::io::Error::from_raw_os_error(e)).context("creating the clsact qdisc"),
    }
}

#[cfg(feature = "libbpf")]
/// Remove the clsact qdisc (with it, any filter left on it).
fn clsact_qdisc_destroy(ifindex: u32) -> Result<()> {
    let mut h = qdisc_hook(ifindex);
    // SAFETY: as above.
    let r = unsafe { libbpf_rs::libbpf_sys::bpf_tc_hook_destroy(&mut h) };
    if r != 0 && -r != libc::ENOENT && -r != libc::EINVAL {
        return Err(std::io::Error::from_raw_os_error(-r)).context("removing the clsact qdisc");
    }
    Ok(())
}

#[cfg(feature = "libbpf")]
/// Attach our filter in our claimed `slot`. Runs inside the interface's namespace.
pub(super) fn clsact_attach(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    egress: bool,
    slot: (u32, u16),
) -> Result<()> {
    let mut hook = clsact_hook(prog, ifindex, egress, slot);
    hook.attach().context("attaching the clsact filter")?;
    Ok(())
}

#[cfg(feature = "libbpf")]
fn clsact_detach(ifindex: u32, egress: bool, slot: u32, priority: u16) -> Result<()> {
    // the fd is not used by detach (handle/priority identify the filter)
    let devnull = std::fs::File::open("/dev/null")?;
    let mut hook = clsact_hook(devnull.as_fd(), ifindex, egress, (slot, priority));
    hook.detach().map_err(anyhow::Error::from)
}
