//! The TCP view loaded by libbpf-rs (C libbpf inside) through the generated
//! skeleton: `bpf/tcp.bpf.c`'s sock_ops, iter/tcp and optional per-ACK
//! programs.
use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::TcpView;
use super::{
    cidr_key, free_slot, hint_entries, read_slots, TcpFlowState, TcpHookInfo, TcpViewConfig,
};
use crate::bpf::tcp::types::{rttscope_cidr_key, rttscope_listener_key, rttscope_tcp_counter as C};
use crate::bpf::tcp::{TcpSkel, TcpSkelBuilder};
use crate::sys::netns::{self, NetNs};
use crate::views::libbpf::LibbpfRing;
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// The TCP view, loaded and attached by libbpf.
pub struct LibbpfTcp {
    skel: TcpSkel<'static>,
    _sockops_link: libbpf_rs::Link,
    ack_link: Option<libbpf_rs::Link>,
    listeners: HashSet<(u32, u16)>,
    info: TcpHookInfo,
    epoch: u32,
    raw: bool,
    raw_taken: bool,
}

impl LibbpfTcp {
    /// Load, configure and attach. Fails with one clear sentence.
    pub fn attach(cfg: &TcpViewConfig) -> Result<LibbpfTcp> {
        cfg.validate()?;
        crate::sys::preflight::require_bpf_caps()?;
        crate::sys::preflight::require_btf()?;
        let (cg, cgroup) = crate::sys::preflight::open_cgroup(cfg.cgroup.as_deref())?;

        let max_flows = cfg.max_flows.max(16);
        let hints = hint_entries(max_flows);
        // The per-ACK hook is a program of the same object: where the kernel
        // refuses it, the object is loaded again without it (one refused
        // program fails a whole libbpf object).
        let mut hook_status = Err("off".to_string());
        let mut skel = if cfg.ack_hook.wanted() {
            match Self::open_and_load(cfg, max_flows, hints, true) {
                Ok(skel) => {
                    hook_status = Ok(());
                    skel
                }
                Err(e) => {
                    let skel = Self::open_and_load(cfg, max_flows, hints, false)?;
                    hook_status = Err(cfg.ack_hook.refused(&e)?);
                    skel
                }
            }
        } else {
            Self::open_and_load(cfg, max_flows, hints, false)?
        };
        // Attached before the sock_ops program, so that no connection ever
        // gets the RTT callback while the hook has its samples.
        let ack_link = match hook_status {
            Ok(()) => match skel.progs.rtt_tcp_ack.attach() {
                Ok(link) => {
                    if let Some(bss) = skel.maps.bss_data.as_deref_mut() {
                        bss.ack_hook_on = 1;
                    }
                    Some(link)
                }
                Err(e) => {
                    let e = anyhow::Error::from(e).context("attaching the per-ACK hook");
                    hook_status = Err(cfg.ack_hook.refused(&e)?);
                    None
                }
            },
            Err(_) => None,
        };

        for ns in &cfg.netns_filter {
            skel.maps
                .netns_filter
                .update(&ns.inode.to_ne_bytes(), &[1], MapFlags::ANY)?;
        }
        for p in &cfg.ports {
            skel.maps
                .port_filter
                .update(&p.to_ne_bytes(), &[1], MapFlags::ANY)?;
        }
        for c in &cfg.cidrs {
            let k = cidr_key(c);
            // SAFETY of layout: rttscope_cidr_key is a generated C struct (u32 + [u8;16]).
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&k as *const rttscope_cidr_key).cast::<u8>(),
                    std::mem::size_of::<rttscope_cidr_key>(),
                )
            };
            skel.maps.addr_filter.update(bytes, &[1], MapFlags::ANY)?;
        }

        let link = skel
            .progs
            .rtt_tcp_sockops
            .attach_cgroup(cg.as_raw_fd())
            .with_context(|| format!("attaching sock_ops to cgroup {}", cgroup.display()))?;

        let mut view = LibbpfTcp {
            skel,
            _sockops_link: link,
            ack_link,
            listeners: HashSet::new(),
            info: TcpHookInfo::new(cfg, &cgroup, max_flows),
            epoch: 0,
            raw: cfg.raw,
            raw_taken: false,
        };
        view.info.set_ack_hook(hook_status);
        view.info.prog_ids = view.prog_ids().into_iter().map(|(_, id)| id).collect();
        for ns in &cfg.iter_netns {
            view.enable_existing(ns)?;
        }
        let (enabled, refused) = (
            view.counter(C::RTTSCOPE_TCP_ENABLED),
            view.counter(C::RTTSCOPE_TCP_ITER_SETSOCKOPT_FAIL),
        );
        view.info.set_existing(enabled, refused);
        view.load_listeners();
        Ok(view)
    }

    /// Open the object, size and configure it, load it (with or without the
    /// per-ACK hook program).
    fn open_and_load(
        cfg: &TcpViewConfig,
        max_flows: u32,
        hints: u32,
        with_hook: bool,
    ) -> Result<TcpSkel<'static>> {
        // The skeleton borrows its open object for its whole life; a view lives
        // as long as the command, so the (small) storage is leaked on purpose.
        let open_object = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = TcpSkelBuilder::default()
            .open(open_object)
            .context("opening the TCP view's BPF object")?;
        open.maps
            .tcp_flows
            .set_max_entries(max_flows)
            .context("sizing the flow map")?;
        open.maps
            .tcp_free_slots
            .set_max_entries(max_flows)
            .context("sizing the free-slot stack")?;
        open.maps
            .tcp_hints
            .set_max_entries(hints)
            .context("sizing the slot hints")?;
        open.progs.rtt_tcp_ack.set_autoload(with_hook);
        {
            let ro = open
                .maps
                .rodata_data
                .as_deref_mut()
                .context("TCP view object has no .rodata")?;
            ro.cfg_netns_filter = !cfg.netns_filter.is_empty() as u32;
            ro.cfg_port_filter = !cfg.ports.is_empty() as u32;
            ro.cfg_addr_filter = !cfg.cidrs.is_empty() as u32;
            ro.cfg_raw = cfg.raw as u32;
            ro.cfg_max_slots = max_flows;
            ro.cfg_hint_mask = hints - 1;
        }
        open.load().map_err(|e| load_error(e, max_flows))
    }

    /// Run the iterator inside `ns`: an iterator only walks the namespace
    /// of the thread that creates it.
    fn enable_existing(&mut self, ns: &NetNs) -> Result<()> {
        let link = self
            .skel
            .progs
            .rtt_tcp_iter
            .attach()
            .context("attaching the iter/tcp program")?;
        let name = ns.name.clone();
        // libbpf_rs::Link is not Send: create the iterator fd inside the
        // namespace from the link's raw fd.
        let link_fd = link.as_fd().as_raw_fd();
        netns::scoped(ns, move || -> Result<()> {
            // SAFETY: plain syscall wrapper on a valid link fd.
            let fd = unsafe { libbpf_sys::bpf_iter_create(link_fd) };
            if fd < 0 {
                anyhow::bail!(
                    "creating the TCP iterator in '{name}': {}",
                    std::io::Error::from_raw_os_error(-fd)
                );
            }
            // SAFETY: fd was just returned to us and is owned here.
            let mut it = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let mut sink = Vec::new();
            it.read_to_end(&mut sink)
                .with_context(|| format!("walking TCP sockets in '{name}'"))?;
            Ok(())
        })?;
        drop(link);
        Ok(())
    }

    fn load_listeners(&mut self) {
        let m = &self.skel.maps.tcp_listeners;
        for k in m.keys() {
            if k.len() >= std::mem::size_of::<rttscope_listener_key>() {
                let netns = u32::from_ne_bytes(k[0..4].try_into().unwrap());
                let port = u16::from_ne_bytes(k[4..6].try_into().unwrap());
                self.listeners.insert((netns, port));
            }
        }
    }

    /// The raw-sample ring buffer map (for `--raw`).
    fn events_map(&self) -> &libbpf_rs::Map<'static> {
        &self.skel.maps.tcp_events
    }

    /// IDs of the loaded programs (for run-time statistics).
    fn program_ids(&self) -> Vec<(&'static str, u32)> {
        use libbpf_rs::AsRawLibbpf;
        let id = |p: &libbpf_rs::Program| {
            // SAFETY: valid program handle from the loaded skeleton.
            let fd = unsafe { libbpf_sys::bpf_program__fd(p.as_libbpf_object().as_ptr()) };
            let mut info = libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: info is a valid out-buffer of `len` bytes.
            unsafe {
                libbpf_sys::bpf_obj_get_info_by_fd(
                    fd,
                    (&mut info as *mut libbpf_sys::bpf_prog_info).cast(),
                    &mut len,
                )
            };
            info.id
        };
        let mut ids = vec![
            ("tcp_sockops", id(&self.skel.progs.rtt_tcp_sockops)),
            ("tcp_iter", id(&self.skel.progs.rtt_tcp_iter)),
        ];
        if self.ack_link.is_some() {
            ids.push(("tcp_ack_hook", id(&self.skel.progs.rtt_tcp_ack)));
        }
        ids
    }
}

impl PassiveView for LibbpfTcp {
    fn view(&self) -> ViewKind {
        ViewKind::Tcp
    }
    fn loader(&self) -> LoaderKind {
        LoaderKind::Libbpf
    }
    fn prog_ids(&self) -> Vec<(String, u32)> {
        self.program_ids()
            .into_iter()
            .map(|(n, i)| (n.to_string(), i))
            .collect()
    }
    fn counters(&self) -> Result<std::collections::BTreeMap<&'static str, u64>> {
        Ok(super::all_counters(self))
    }
    fn raw_samples(&mut self) -> Result<RawSamples> {
        if !self.raw {
            anyhow::bail!("raw samples were not enabled when the TCP view was loaded");
        }
        if self.raw_taken {
            anyhow::bail!("the raw-sample stream was already taken");
        }
        let ring = LibbpfRing::new(self.events_map())?;
        self.raw_taken = true;
        RawSamples::new(Box::new(ring))
    }
}

impl TcpView for LibbpfTcp {
    fn info(&self) -> &TcpHookInfo {
        &self.info
    }

    /// Sum of one per-CPU counter.
    fn counter(&self, c: C) -> u64 {
        let key = c.0.to_ne_bytes();
        match self
            .skel
            .maps
            .tcp_counters
            .lookup_percpu(&key, MapFlags::ANY)
        {
            Ok(Some(per_cpu)) => per_cpu
                .iter()
                .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                .sum(),
            _ => 0,
        }
    }

    /// The current report epoch (win_* values of flows belong to it when equal).
    fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Start a new report interval: flows' win_min/win_max restart.
    fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.epoch = self.epoch;
        }
    }

    /// Read every flow entry (batched: a few syscalls for thousands of
    /// flows), handing each to `f` without keeping them all in memory.
    fn for_each_flow(&self, f: &mut dyn FnMut(TcpFlowState)) -> Result<()> {
        let hwm = self
            .skel
            .maps
            .bss_data
            .as_deref()
            .map_or(u64::MAX, |b| b.slots_hwm);
        read_slots(
            self.skel.maps.tcp_flows.as_fd(),
            hwm,
            self.info.max_flows,
            &self.listeners,
            f,
        )
    }

    /// Give a flow's slot back (after it was reported closed, or to evict it).
    fn forget(&mut self, slot: u32, gen: u32) -> Result<()> {
        free_slot(
            self.skel.maps.tcp_flows.as_fd(),
            self.skel.maps.tcp_free_slots.as_fd(),
            slot,
            gen,
        )
    }
}

/// A failed load of the TCP view's object, in one sentence: ENOMEM (creating maps of `max_flows`
/// entries the kernel cannot allocate) is a memory problem, not a verifier or BTF one.
pub(crate) fn load_error(e: libbpf_rs::Error, max_flows: u32) -> anyhow::Error {
    if e.kind() == libbpf_rs::ErrorKind::OutOfMemory {
        anyhow::anyhow!(
            "loading the TCP view into the kernel: not enough memory for its maps of {max_flows} flows (lower --max-flows, or check the memory cgroup and RLIMIT_MEMLOCK): {e}"
        )
    } else {
        anyhow::Error::new(e).context(
            "loading the TCP view into the kernel (verifier or BTF problem; run with -vv for libbpf's log)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENOMEM at load is reported as memory, with the size asked for; anything else keeps the
    /// verifier/BTF hint.
    #[test]
    fn enomem_at_load_is_a_memory_problem() {
        let e = load_error(libbpf_rs::Error::from_raw_os_error(libc::ENOMEM), 4096).to_string();
        assert!(
            e.contains("not enough memory for its maps of 4096 flows") && !e.contains("verifier"),
            "{e}"
        );
        let e = load_error(libbpf_rs::Error::from_raw_os_error(libc::EINVAL), 4096);
        assert!(
            format!("{e:#}").contains("verifier or BTF problem"),
            "{e:#}"
        );
    }
}
