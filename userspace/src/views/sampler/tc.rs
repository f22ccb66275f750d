//! Attaching the sampler's programs (libbpf loader): tcx links, or clsact
//! filters with our handle and priority where tcx is unavailable or clsact
//! is asked for; filters of ours left by a crashed run are removed first,
//! ours are removed on drop.
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

use super::{CLSACT_HANDLE, CLSACT_PRIORITY};
use crate::sys::netns::{self, NetNs};

pub(super) enum Attached {
    /// A tcx link: closing the fd detaches it.
    Tcx(#[allow(dead_code)] OwnedFd),
    /// A clsact filter: removed explicitly on drop.
    Clsact {
        ns: NetNs,
        ifindex: u32,
        egress: bool,
        /// We created the clsact qdisc: remove it after our filters.
        created_qdisc: bool,
    },
}

/// Our attachments; dropping them detaches (also on an error half-way
/// through `attach`, so a failed start leaves no clsact filter behind).
#[derive(Default)]
pub(super) struct Attachments(pub(super) Vec<Attached>);

impl Drop for Attachments {
    fn drop(&mut self) {
        let mut qdiscs = Vec::new();
        for a in self.0.drain(..) {
            if let Attached::Clsact {
                ns,
                ifindex,
                egress,
                created_qdisc,
            } = a
            {
                let ns2 = ns.clone();
                if let Err(e) = netns::run_in(&ns2, move || clsact_detach(ifindex, egress)) {
                    tracing::warn!("removing clsact filter (ifindex {ifindex}): {e:#}");
                }
                if created_qdisc {
                    qdiscs.push((ns, ifindex));
                }
            }
            // tcx: the link fd closes here
        }
        for (ns, ifindex) in qdiscs {
            if let Err(e) = netns::run_in(&ns, move || clsact_qdisc_destroy(ifindex)) {
                tracing::warn!("removing clsact qdisc (ifindex {ifindex}): {e:#}");
            }
        }
    }
}

pub(super) fn tcx_attach(prog_fd: i32, ifindex: u32, egress: bool) -> Result<OwnedFd> {
    let at = if egress {
        libbpf_rs::libbpf_sys::BPF_TCX_EGRESS
    } else {
        libbpf_rs::libbpf_sys::BPF_TCX_INGRESS
    };
    // SAFETY: plain syscall wrapper; NULL opts = append after existing programs.
    let fd = unsafe {
        libbpf_rs::libbpf_sys::bpf_link_create(prog_fd, ifindex as i32, at, std::ptr::null())
    };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd).into());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn clsact_hook(prog_fd: BorrowedFd<'_>, ifindex: u32, egress: bool) -> libbpf_rs::TcHook {
    let mut b = libbpf_rs::TcHookBuilder::new(prog_fd);
    b.ifindex(ifindex as i32)
        .replace(true)
        .handle(CLSACT_HANDLE)
        .priority(CLSACT_PRIORITY);
    b.hook(if egress {
        libbpf_rs::TC_EGRESS
    } else {
        libbpf_rs::TC_INGRESS
    })
}

/// Name of a loaded program, by id.
fn prog_name(id: u32) -> Option<String> {
    libbpf_rs::query::ProgInfoIter::default()
        .find(|p| p.id == id)
        .map(|p| p.name.to_string_lossy().into_owned())
}

/// Remove a clsact filter of ours (handle/priority, program name rtt_sampler_*)
/// left by an earlier run on this hook. Runs inside the interface's namespace.
fn clsact_cleanup(prog_fd: BorrowedFd<'_>, ifindex: u32, egress: bool) -> Result<bool> {
    let mut hook = clsact_hook(prog_fd, ifindex, egress);
    let Ok(id) = hook.query() else {
        return Ok(false); // no clsact qdisc, or no filter at our handle
    };
    match prog_name(id) {
        Some(n) if n.starts_with("rtt_sampler_") => {
            hook.detach().context("removing a stale rttscope clsact filter")?;
            Ok(true)
        }
        Some(n) => bail!(
            "a foreign tc filter ({n}) sits at our handle {CLSACT_HANDLE:#x} priority {CLSACT_PRIORITY:#x}"
        ),
        None => Ok(false),
    }
}

fn qdisc_hook(ifindex: u32) -> libbpf_rs::libbpf_sys::bpf_tc_hook {
    libbpf_rs::libbpf_sys::bpf_tc_hook {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_tc_hook>() as _,
        ifindex: ifindex as i32,
        attach_point: libbpf_rs::libbpf_sys::BPF_TC_INGRESS | libbpf_rs::libbpf_sys::BPF_TC_EGRESS,
        ..Default::default()
    }
}

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

/// Remove the clsact qdisc we created (with it, any filter left on it).
fn clsact_qdisc_destroy(ifindex: u32) -> Result<()> {
    let mut h = qdisc_hook(ifindex);
    // SAFETY: as above.
    let r = unsafe { libbpf_rs::libbpf_sys::bpf_tc_hook_destroy(&mut h) };
    if r != 0 && -r != libc::ENOENT && -r != libc::EINVAL {
        return Err(std::io::Error::from_raw_os_error(-r)).context("removing the clsact qdisc");
    }
    Ok(())
}

/// Returns true if this call created the clsact qdisc.
pub(super) fn clsact_attach(prog_fd: i32, ifindex: u32, egress: bool) -> Result<bool> {
    // SAFETY: prog_fd belongs to a loaded Object that outlives this call.
    let fd = unsafe { BorrowedFd::borrow_raw(prog_fd) };
    if clsact_cleanup(fd, ifindex, egress)? {
        tracing::info!("removed a stale rttscope clsact filter (ifindex {ifindex})");
    }
    let created = clsact_qdisc_create(ifindex)?;
    let mut hook = clsact_hook(fd, ifindex, egress);
    hook.attach().context("attaching the clsact filter")?;
    Ok(created)
}

fn clsact_detach(ifindex: u32, egress: bool) -> Result<()> {
    // the fd is not used by detach (handle/priority identify the filter)
    let devnull = std::fs::File::open("/dev/null")?;
    let mut hook = clsact_hook(devnull.as_fd(), ifindex, egress);
    hook.detach().map_err(anyhow::Error::from)
}
