//! The aya loader: the same `tcp.bpf.o` as the libbpf loader, loaded by
//! aya 0.14 (pure Rust: ELF, BTF and CO-RE relocation in Rust, no C libbpf).
//!
//! Mapping of what the libbpf skeleton does to aya:
//! - `.rodata` config (`cfg_*`): `EbpfLoader::override_global` before load;
//! - `tcp_flows`, `tcp_free_slots` and `tcp_hints` capacity (--max-flows):
//!   `EbpfLoader::map_max_entries` (and `cfg_max_slots`, `cfg_hint_mask`); the slot array is
//!   read and freed slots pushed through the shared raw-syscall helpers
//!   (aya 0.14 has no batch lookup), on the maps' fds;
//! - `.bss` `epoch`: the `.bss` array map, value type = the generated `bss`
//!   layout struct, read-modify-written each interval;
//! - sock_ops: `SockOps::attach`, which creates a BPF link (kernel >= 5.7),
//!   so SIGKILL leaves nothing attached, as with libbpf;
//! - iter/tcp: `Iter::load("tcp")`, one link per namespace, turned into an
//!   iterator fd on a thread that entered that namespace;
//! - ring buffer: `aya::maps::RingBuf`, polled through tokio's `AsyncFd`.
use std::collections::HashSet;
use std::io::Read;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use aya::maps::lpm_trie::Key as LpmKey;
use aya::maps::{Array, HashMap, LpmTrie, MapData, PerCpuArray, RingBuf};
use aya::programs::{CgroupAttachMode, FExit, Iter, SockOps};
use aya::{Btf, Ebpf, EbpfLoader, Pod};

use crate::bpf::tcp::types::{bss, rttscope_listener_key, rttscope_tcp_counter as C};
use crate::bpf::{FlowKey, TcpFlow};
use crate::sys::netns::{self, NetNs};
use crate::views::aya::{chain, AyaRing};
use crate::views::tcp::{
    cidr_key, free_slot, read_slots, TcpFlowState, TcpHookInfo, TcpView, TcpViewConfig,
};
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// The compiled TCP view (the very object the libbpf skeleton embeds).
static TCP_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tcp.bpf.o"));

// SAFETY: generated `#[repr(C)]` structs of integers and arrays of integers
// (Copy, no pointers, no invariants): any bit pattern is a valid value.
unsafe impl Pod for FlowKey {}
// SAFETY: as above.
unsafe impl Pod for TcpFlow {}
// SAFETY: as above.
unsafe impl Pod for rttscope_listener_key {}
// SAFETY: as above; the `.bss` layout struct generated from the object's BTF.
unsafe impl Pod for bss {}

const SOCKOPS: &str = "rtt_tcp_sockops";
const ITER: &str = "rtt_tcp_iter";
const ACK_HOOK_PROG: &str = "rtt_tcp_ack";

pub struct AyaTcp {
    ebpf: Ebpf,
    flows: MapData,
    free_slots: MapData,
    counters: PerCpuArray<MapData, u64>,
    bss: Array<MapData, bss>,
    events: Option<RingBuf<MapData>>,
    listeners: HashSet<(u32, u16)>,
    info: TcpHookInfo,
    epoch: u32,
}

fn map_err(what: &str, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

impl AyaTcp {
    /// Load, configure and attach. Fails with one clear sentence.
    pub fn attach(cfg: &TcpViewConfig) -> Result<Self> {
        cfg.validate()?;
        crate::sys::preflight::require_bpf_caps()?;
        crate::sys::preflight::require_btf()?;
        let (cg, cgroup) = crate::sys::preflight::open_cgroup(cfg.cgroup.as_deref())?;

        let btf =
            Btf::from_sys_fs().context("reading the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
        let max_flows = cfg.max_flows.max(16);
        let netns_on = u32::from(!cfg.netns_filter.is_empty());
        let port_on = u32::from(!cfg.ports.is_empty());
        let addr_on = u32::from(!cfg.cidrs.is_empty());
        let raw_on = u32::from(cfg.raw);
        let hints = crate::views::tcp::hint_entries(max_flows);
        let hint_mask = hints - 1;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("tcp_flows", max_flows)
            .map_max_entries("tcp_free_slots", max_flows)
            .map_max_entries("tcp_hints", hints)
            .override_global("cfg_netns_filter", &netns_on, true)
            .override_global("cfg_port_filter", &port_on, true)
            .override_global("cfg_addr_filter", &addr_on, true)
            .override_global("cfg_raw", &raw_on, true)
            .override_global("cfg_max_slots", &max_flows, true)
            .override_global("cfg_hint_mask", &hint_mask, true)
            .load(TCP_OBJ)
            .map_err(|e| map_err("opening the TCP view's BPF object with aya", chain(&e)))?;

        // Filters go in before the program is attached.
        {
            let mut m: HashMap<_, u32, u8> = HashMap::try_from(map(&mut ebpf, "netns_filter")?)?;
            for ns in &cfg.netns_filter {
                m.insert(ns.inode, 1, 0)
                    .map_err(|e| map_err("filling the netns filter", e))?;
            }
        }
        {
            let mut m: HashMap<_, u16, u8> = HashMap::try_from(map(&mut ebpf, "port_filter")?)?;
            for p in &cfg.ports {
                m.insert(p, 1, 0)
                    .map_err(|e| map_err("filling the port filter", e))?;
            }
        }
        {
            let mut m: LpmTrie<_, [u8; 16], u8> =
                LpmTrie::try_from(map(&mut ebpf, "addr_filter")?)?;
            for c in &cfg.cidrs {
                // Same key as the libbpf loader (shared `cidr_key`); aya's LPM
                // key is the same layout (u32 prefix length, then the data).
                let k = cidr_key(c);
                m.insert(&LpmKey::new(k.prefixlen, k.addr), 1, 0)
                    .map_err(|e| map_err("filling the address filter", e))?;
            }
        }

        let prog: &mut SockOps = ebpf
            .program_mut(SOCKOPS)
            .context("the TCP view object has no sock_ops program")?
            .try_into()?;
        prog.load().map_err(|e| {
            map_err(
                "loading the TCP view's sock_ops program with aya (verifier or BTF problem; run with -vv)",
                chain(&e),
            )
        })?;
        // The optional per-ACK hook, attached before the sock_ops program so
        // that no connection gets the RTT callback while the hook has its samples.
        let hook_status = if cfg.ack_hook.wanted() {
            match attach_ack_hook(&mut ebpf, &btf) {
                Ok(()) => Ok(()),
                Err(e) => Err(cfg.ack_hook.refused(&e)?),
            }
        } else {
            Err("off".to_string())
        };
        let prog: &mut SockOps = ebpf
            .program_mut(SOCKOPS)
            .context("the TCP view object has no sock_ops program")?
            .try_into()?;
        prog.attach(&cg, CgroupAttachMode::Single).map_err(|e| {
            map_err(
                &format!("attaching sock_ops to cgroup {}", cgroup.display()),
                chain(&e),
            )
        })?;

        let it: &mut Iter = ebpf
            .program_mut(ITER)
            .context("the TCP view object has no iter/tcp program")?
            .try_into()?;
        it.load("tcp", &btf).map_err(|e| {
            map_err(
                "loading the TCP view's iter/tcp program with aya",
                chain(&e),
            )
        })?;

        let aya::maps::Map::Array(flows) = take(&mut ebpf, "tcp_flows")? else {
            anyhow::bail!("the TCP view object's tcp_flows is not an array map");
        };
        let aya::maps::Map::Stack(free_slots) = take(&mut ebpf, "tcp_free_slots")? else {
            anyhow::bail!("the TCP view object's tcp_free_slots is not a stack map");
        };
        let counters = PerCpuArray::try_from(take(&mut ebpf, "tcp_counters")?)?;
        let bss = Array::try_from(take(&mut ebpf, ".bss")?)?;
        let events = if cfg.raw {
            Some(RingBuf::try_from(take(&mut ebpf, "tcp_events")?)?)
        } else {
            None
        };
        let mut view = AyaTcp {
            ebpf,
            flows,
            free_slots,
            counters,
            bss,
            events,
            listeners: HashSet::new(),
            info: TcpHookInfo::new(cfg, &cgroup, max_flows),
            epoch: 0,
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
        view.load_listeners()?;
        Ok(view)
    }

    /// Run the iterator inside `ns` (an iterator walks only the namespace of
    /// the thread that creates it).
    fn enable_existing(&mut self, ns: &NetNs) -> Result<()> {
        let it: &mut Iter = self
            .ebpf
            .program_mut(ITER)
            .context("the TCP view object has no iter/tcp program")?
            .try_into()?;
        let id = it
            .attach()
            .map_err(|e| map_err("attaching the iter/tcp program", chain(&e)))?;
        let link = it
            .take_link(id)
            .map_err(|e| map_err("taking the iterator link", chain(&e)))?;
        let name = ns.name.clone();
        netns::scoped(ns, move || -> Result<()> {
            let mut it = link.into_file().map_err(|e| {
                map_err(&format!("creating the TCP iterator in '{name}'"), chain(&e))
            })?;
            let mut sink = Vec::new();
            it.read_to_end(&mut sink)
                .with_context(|| format!("walking TCP sockets in '{name}'"))?;
            Ok(())
        })
    }

    fn load_listeners(&mut self) -> Result<()> {
        let m: HashMap<_, rttscope_listener_key, u8> =
            HashMap::try_from(map(&mut self.ebpf, "tcp_listeners")?)?;
        for k in m.keys().flatten() {
            self.listeners.insert((k.netns, k.port));
        }
        Ok(())
    }
}

fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name)
        .with_context(|| format!("the TCP view object has no map `{name}`"))
}

/// Load and attach the per-ACK hook (aya loads each program on its own, so
/// a refused hook leaves the rest loaded) and tell the other programs.
fn attach_ack_hook(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let hook: &mut FExit = ebpf
        .program_mut(ACK_HOOK_PROG)
        .context("the TCP view object has no per-ACK hook program")?
        .try_into()?;
    hook.load("tcp_ack_update_rtt", btf).map_err(|e| match e {
        // the errno is the reason (as with libbpf); the verifier's log, if
        // any, is a detail shown with -v
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            tracing::info!("per-ACK hook: verifier log: {verifier_log}");
            anyhow::Error::from(io_error).context("loading the per-ACK hook with aya")
        }
        e => map_err("loading the per-ACK hook with aya", chain(&e)),
    })?;
    hook.attach()
        .map_err(|e| map_err("attaching the per-ACK hook with aya", chain(&e)))?;
    let mut bss: Array<&mut MapData, bss> = Array::try_from(map(ebpf, ".bss")?)?;
    let mut v = bss
        .get(&0, 0)
        .map_err(|e| map_err("reading the TCP view's .bss", e))?;
    v.ack_hook_on = 1;
    bss.set(0, v, 0)
        .map_err(|e| map_err("writing the TCP view's .bss", e))?;
    Ok(())
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("the TCP view object has no map `{name}`"))
}

impl PassiveView for AyaTcp {
    fn view(&self) -> ViewKind {
        ViewKind::Tcp
    }

    fn loader(&self) -> LoaderKind {
        LoaderKind::Aya
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        let id = |name: &str| {
            self.ebpf
                .program(name)
                .and_then(|p| p.info().ok())
                .map(|i| i.id())
                .unwrap_or(0)
        };
        let mut ids = vec![("tcp_sockops", id(SOCKOPS)), ("tcp_iter", id(ITER))];
        if self.info.ack_hook_attached() {
            ids.push(("tcp_ack_hook", id(ACK_HOOK_PROG)));
        }
        ids.into_iter().map(|(n, i)| (n.to_string(), i)).collect()
    }

    fn counters(&self) -> Result<std::collections::BTreeMap<&'static str, u64>> {
        Ok(super::all_counters(self))
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        match self.events.take() {
            Some(rb) => RawSamples::new(Box::new(AyaRing(rb))),
            None => anyhow::bail!(
                "raw samples were not enabled when the TCP view was loaded, or were already taken"
            ),
        }
    }
}

impl TcpView for AyaTcp {
    fn info(&self) -> &TcpHookInfo {
        &self.info
    }

    fn for_each_flow(&self, f: &mut dyn FnMut(TcpFlowState)) -> Result<()> {
        let hwm = self.bss.get(&0, 0).map_or(u64::MAX, |b| b.slots_hwm);
        read_slots(
            self.flows.fd().as_fd(),
            hwm,
            self.info.max_flows,
            &self.listeners,
            f,
        )
    }

    fn counter(&self, c: C) -> u64 {
        match self.counters.get(&c.0, 0) {
            Ok(per_cpu) => per_cpu.iter().sum(),
            Err(_) => 0,
        }
    }

    fn epoch(&self) -> u32 {
        self.epoch
    }

    fn next_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        // Only userspace writes `.bss` (the kernel programs read `epoch`).
        if let Ok(mut v) = self.bss.get(&0, 0) {
            v.epoch = self.epoch;
            if let Err(e) = self.bss.set(0, v, 0) {
                tracing::warn!("aya: writing the report epoch: {e}");
            }
        }
    }

    fn forget(&mut self, slot: u32, gen: u32) -> Result<()> {
        free_slot(
            self.flows.fd().as_fd(),
            self.free_slots.fd().as_fd(),
            slot,
            gen,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the BPF_PROG_LOAD syscall failed. Verifier output: 0: (b7) r0 = 0\n1: (95) exit\nR0 !read_ok")]
    struct Verifier;

    #[derive(Debug, thiserror::Error)]
    #[error("loading program")]
    struct Outer(#[source] Verifier);

    #[test]
    fn verifier_log_is_cut_to_one_line() {
        let s = chain(&Outer(Verifier));
        assert!(!s.contains('\n'), "{s}");
        assert!(
            s.starts_with("loading program: the BPF_PROG_LOAD syscall failed"),
            "{s}"
        );
        assert!(s.ends_with("(details with -v)"), "{s}");
        let plain = chain(&std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(plain.contains("Operation not permitted"), "{plain}");
    }

    #[test]
    fn embedded_object_is_the_tcp_view() {
        // The object aya loads is the one build.rs compiled (ELF, BPF machine).
        assert_eq!(&TCP_OBJ[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([TCP_OBJ[18], TCP_OBJ[19]]), 247); // EM_BPF
    }
}
