//! The sampler view loaded by aya 0.14: the same `sampler.bpf.o` as the
//! libbpf loader (`crate::views::sampler::LibbpfSampler`), the same behaviour.
//!
//! Mapping of what the libbpf loader does to aya:
//! - one copy of the object per interface, with that interface's namespace
//!   inode, ifindex, link type, sampling threshold, matching rule, raw switch
//!   and pending timeout in `.rodata`: `EbpfLoader::override_global`;
//! - later copies share the first copy's maps (libbpf: `bpf_map__reuse_fd`):
//!   aya 0.14 has no "reuse this fd" call, but `EbpfLoader::map_pin_path`
//!   opens a map already pinned at that path instead of creating one. The
//!   first copy creates and pins the four shared maps (flow table,
//!   counters, epoch, ring buffer), the next copies open them. The pins go
//!   on a bpffs instance mounted by a thread in a mount namespace of its own
//!   (gone with the thread, seen by nobody else; works under `ip netns exec`
//!   where /sys/fs/bpf is not bpffs), else in a private directory under
//!   `/sys/fs/bpf` removed right after loading. The maps then live on
//!   through the loaded programs and our fds, as with libbpf;
//! - the flow table's size (`--max-flows`):
//!   `EbpfLoader::map_max_entries`, its set mask and hash seed in `.rodata`;
//! - tcx links: `SchedClassifier::attach_with_options(iface,
//!   TcAttachType::Egress/Ingress, TcAttachOptions::TcxOrder(..))` called on
//!   a thread that entered the interface's namespace (the interface is
//!   looked up by name there); a link detaches when its fd closes, i.e. when
//!   the `Ebpf` is dropped or the process dies;
//! - clsact filters (where the feature probe finds no tcx, or `--attach
//!   clsact`): the programs aya loaded are attached by the same netlink code
//!   as the libbpf loader's (`tc.rs`: a claimed slot per interface, stale
//!   filters of killed observers removed, ours removed on drop), so both
//!   loaders attach the same way on every kernel. That code is built with the
//!   `libbpf` feature; an aya-only build refuses clsact in one sentence;
//! - reading and decoding (flow table, counters, raw samples) is shared
//!   with the libbpf loader: `sampler::{table_flows, derived_counters}` (the
//!   table is read with a raw `BPF_MAP_LOOKUP_BATCH` on the map's fd) and
//!   the views' common raw-sample stream.
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{LinkOrder, SchedClassifier, TcAttachType};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::views::aya::{chain, AyaRing};
use crate::views::sampler::{
    attach_info, derived_counters, hash_seed, resolve_ifaces, table_flows, AttachInfo, AttachMode,
    IfaceSpec, ResolvedIface, SamplerConfig, SamplerFlowStats, SamplerView, COUNTERS, PROG_EGRESS,
    PROG_INGRESS, SHARED_MAPS,
};
use crate::views::{LoaderKind, PassiveView, RawSamples, ViewKind};

/// The compiled sampler (the very object the libbpf skeleton embeds).
static SAMPLER_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sampler.bpf.o"));

// The maps every copy shares: `sampler::SHARED_MAPS` (`.rodata` is per
// copy, as with the libbpf loader).

/// A private bpffs directory for the shared maps' pins; removed (with the
/// pins: the maps themselves stay alive through their fds) on drop.
struct PinDir(PathBuf);

impl PinDir {
    fn create() -> Result<PinDir> {
        // Random name, mode 0700, made exclusively (sys/files.rs).
        let dir = crate::sys::files::create_private_dir_in(
            std::path::Path::new("/sys/fs/bpf"),
            &format!("rttscope-sampler-{}-", std::process::id()),
        )
        .context(
            "creating a directory in /sys/fs/bpf to share the sampler's maps between interfaces (is bpffs mounted on /sys/fs/bpf?)",
        )?;
        Ok(PinDir(dir))
    }

    fn path(&self, map: &str) -> PathBuf {
        self.0.join(map)
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        for m in SHARED_MAPS {
            let _ = std::fs::remove_file(self.path(m));
        }
        if let Err(e) = std::fs::remove_dir(&self.0) {
            tracing::warn!("removing {}: {e}", self.0.display());
        }
    }
}

/// The sampler view loaded by aya.
pub(crate) struct AyaSampler {
    cfg: SamplerConfig,
    info: Vec<AttachInfo>,
    /// The flow table (an array of `struct rttscope_sampler_entry`), read
    /// through its fd.
    table: MapData,
    counters: PerCpuArray<MapData, u64>,
    epoch_map: Array<MapData, u32>,
    ring: Option<AyaRing>,
    epoch: u32,
    prog_ids: Vec<(String, u32)>,
    /// clsact filters and claims (before the copies: removed first).
    #[cfg(feature = "libbpf")]
    #[allow(dead_code)] // held for its Drop
    attached: super::tc::Attachments,
    // last: dropping a copy closes its tcx links (detach) and unloads it
    #[allow(dead_code)] // held for its Drop
    copies: Vec<Ebpf>,
}

fn err(what: &str, e: impl std::error::Error) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", chain(&e))
}

impl AyaSampler {
    pub(crate) fn attach(ifaces: &[IfaceSpec], cfg: SamplerConfig) -> Result<AyaSampler> {
        let resolved = resolve_ifaces(ifaces, &cfg)?;
        let clsact = match cfg.attach {
            AttachMode::Clsact => true,
            AttachMode::Tcx => false,
            AttachMode::Auto => !crate::views::probe::Features::get().tcx.ok,
        };
        if clsact && !cfg!(feature = "libbpf") {
            bail!("clsact filters under aya need a build with the libbpf feature too (its netlink code attaches them); this kernel has no tcx links (`rttscope features`)");
        }
        crate::sys::preflight::require_bpf_caps()?;
        let btf =
            Btf::from_sys_fs().context("reading the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
        let threshold = cfg.threshold();
        let matching = cfg.matching.raw();
        let raw = u32::from(cfg.raw);
        let timeout_ns = cfg.pending_timeout.as_nanos().min(u64::MAX as u128) as u64;
        let set_mask = cfg.set_mask();
        let seed = hash_seed();
        let protos = cfg.proto_mask();
        // Create the maps of every copy (EbpfLoader::load), sharing them
        // through pins when there is more than one copy (one interface needs
        // no pins, hence no bpffs and no CAP_SYS_ADMIN); the programs are
        // loaded and attached afterwards.
        let load = |pins: Option<&dyn Fn(&str) -> PathBuf>| -> Result<Vec<Ebpf>> {
            let pin_paths: Vec<PathBuf> = match pins {
                Some(pins) => SHARED_MAPS.iter().map(|m| pins(m)).collect(),
                None => Vec::new(),
            };
            let mut copies = Vec::new();
            for r in &resolved {
                let mut loader = EbpfLoader::new();
                loader
                    .btf(Some(&btf))
                    .map_max_entries("sampler_table", cfg.table_entries())
                    .override_global("cfg_netns", &r.ns.inode, true)
                    .override_global("cfg_ifindex", &r.meta.ifindex, true)
                    .override_global("cfg_link", &r.link.0, true)
                    .override_global("cfg_sample_threshold", &threshold, true)
                    .override_global("cfg_match", &matching, true)
                    .override_global("cfg_raw", &raw, true)
                    .override_global("cfg_timeout_ns", &timeout_ns, true)
                    .override_global("cfg_set_mask", &set_mask, true)
                    .override_global("cfg_hash_seed", &seed, true)
                    .override_global("cfg_protos", &protos, true);
                for (m, p) in SHARED_MAPS.iter().zip(&pin_paths) {
                    loader.map_pin_path(m, p.as_path());
                }
                let ebpf = loader.load(SAMPLER_OBJ).map_err(|e| {
                    err(
                        &format!("loading the sampler object with aya for {}", r.spec),
                        e,
                    )
                })?;
                copies.push(ebpf);
            }
            Ok(copies)
        };
        let loaded = if resolved.len() > 1 {
            with_pins(|pins: &dyn Fn(&str) -> PathBuf| load(Some(pins)))?
        } else {
            load(None)?
        };
        let mut copies = Vec::new();
        let mut info = Vec::new();
        let mut prog_ids = Vec::new();
        #[cfg(feature = "libbpf")]
        let mut attached = super::tc::Attachments::default();
        for (
            mut ebpf,
            ResolvedIface {
                spec,
                ns,
                meta,
                link,
            },
        ) in loaded.into_iter().zip(resolved)
        {
            for (egress, pname) in [(true, PROG_EGRESS), (false, PROG_INGRESS)] {
                let prog: &mut SchedClassifier = ebpf
                    .program_mut(pname)
                    .with_context(|| format!("program {pname} missing"))?
                    .try_into()
                    .map_err(|e| err(&format!("program {pname}"), e))?;
                prog.load().map_err(|e| {
                    err(
                        &format!("loading the sampler program {pname} with aya (verifier or BTF problem; run with -vv)"),
                        e,
                    )
                })?;
                if let Ok(i) = prog.info() {
                    prog_ids.push((pname.to_string(), i.id()));
                }
                if clsact {
                    #[cfg(feature = "libbpf")]
                    clsact_attach_in(&mut attached, &ns, prog, meta.ifindex, egress)
                        .with_context(|| format!("attaching a clsact filter to {spec}"))?;
                } else {
                    tcx_attach_in(&ns, prog, &spec.name, egress)
                        .with_context(|| format!("attaching a tcx link to {spec}"))?;
                }
            }
            let how = if clsact { "clsact" } else { "tcx" };
            info.push(attach_info(&spec, &ns, meta.ifindex, how, link));
            copies.push(ebpf);
        }
        let first = copies.first_mut().context("no sampler object loaded")?;
        let mut take = |name: &str| {
            first
                .take_map(name)
                .with_context(|| format!("map {name} missing from the sampler object"))
        };
        let table = match take("sampler_table")? {
            Map::Array(d) => d,
            _ => bail!("sampler_table is not an array"),
        };
        let counters = PerCpuArray::try_from(take("sampler_counters")?)?;
        let epoch_map = Array::try_from(take("sampler_epoch")?)?;
        let ring = if cfg.raw {
            Some(AyaRing(RingBuf::try_from(take("sampler_events")?)?))
        } else {
            None
        };
        Ok(AyaSampler {
            cfg,
            info,
            table,
            counters,
            epoch_map,
            ring,
            epoch: 0,
            prog_ids,
            #[cfg(feature = "libbpf")]
            attached,
            copies,
        })
    }
}

/// Run `f` with a place to pin the shared maps, on a thread of its own.
///
/// First choice: the thread unshares its mount namespace (private
/// propagation) and mounts a fresh bpffs instance over the temporary
/// directory there: nobody else sees it and it vanishes with the thread,
/// even if the process is killed. This also works where /sys/fs/bpf is not
/// bpffs (under `ip netns exec`, which remounts /sys). Without
/// CAP_SYS_ADMIN: a private directory in /sys/fs/bpf, removed afterwards.
fn with_pins<T: Send>(f: impl FnOnce(&dyn Fn(&str) -> PathBuf) -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            match private_bpffs() {
                Ok(dir) => f(&|m: &str| dir.join(m)),
                Err(e) => {
                    tracing::debug!("private bpffs: {e:#}; pinning in /sys/fs/bpf");
                    let pins = PinDir::create()?;
                    f(&|m: &str| pins.path(m))
                }
            }
        })
        .join()
        .map_err(|_| anyhow::anyhow!("map-pinning thread panicked"))?
    })
}

/// A bpffs visible to the calling thread only (see [`with_pins`]).
fn private_bpffs() -> Result<PathBuf> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS | nix::sched::CloneFlags::CLONE_FS)
        .context("unshare(CLONE_NEWNS)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making mounts private")?;
    let dir = std::env::temp_dir();
    mount(
        Some("bpf"),
        &dir,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| format!("mounting bpffs on {}", dir.display()))?;
    Ok(dir)
}

/// Attach `prog` as a clsact filter on `ifindex` in `ns`, through the libbpf
/// loader's netlink code (its slot claim first, once per interface: the
/// egress program comes first, the ingress one reuses the claim).
#[cfg(feature = "libbpf")]
fn clsact_attach_in(
    attached: &mut super::tc::Attachments,
    ns: &crate::sys::netns::NetNs,
    prog: &SchedClassifier,
    ifindex: u32,
    egress: bool,
) -> Result<()> {
    use super::tc::{clsact_attach, clsact_claim, Attached};
    use std::os::fd::AsRawFd;
    let prog_fd = prog
        .fd()
        .map_err(|e| err("the sampler program's fd", e))?
        .as_fd()
        .as_raw_fd();
    let claimed = attached.0.iter().rev().find_map(|a| match a {
        // ifindexes repeat across namespaces: the claim of this interface in this namespace
        Attached::Claim { ns: n, claim } if claim.ifindex == ifindex && n.inode == ns.inode => {
            Some(claim.slot)
        }
        _ => None,
    });
    let slot = match claimed {
        Some(s) => s,
        None => {
            let claim = crate::sys::netns::run_in(ns, move || clsact_claim(ifindex))
                .context("claiming a clsact slot")?;
            let s = claim.slot;
            attached.0.push(Attached::Claim {
                ns: ns.clone(),
                claim,
            });
            s
        }
    };
    crate::sys::netns::run_in(ns, move || clsact_attach(prog_fd, ifindex, egress, slot))?;
    attached.0.push(Attached::Clsact {
        ns: ns.clone(),
        ifindex,
        egress,
        slot,
    });
    Ok(())
}

/// Attach `prog` as a tcx link on `iface` from a thread inside `ns` (the
/// interface name and the link's ifindex are resolved in that namespace).
fn tcx_attach_in(
    ns: &crate::sys::netns::NetNs,
    prog: &mut SchedClassifier,
    iface: &str,
    egress: bool,
) -> Result<()> {
    crate::sys::netns::scoped(ns, move || -> Result<()> {
        let at = if egress {
            TcAttachType::Egress
        } else {
            TcAttachType::Ingress
        };
        // Appended after programs already there, like libbpf's NULL opts.
        prog.attach_with_options(iface, at, TcAttachOptions::TcxOrder(LinkOrder::default()))
            .map_err(|e| {
                err(
                    "tcx attach (tcx links need kernel 6.6 or later: `rttscope features` says whether this kernel has them; --attach auto uses clsact where it has not)",
                    e,
                )
            })?;
        Ok(())
    })
}

impl PassiveView for AyaSampler {
    fn view(&self) -> ViewKind {
        ViewKind::Sampler
    }

    fn loader(&self) -> LoaderKind {
        LoaderKind::Aya
    }

    fn prog_ids(&self) -> Vec<(String, u32)> {
        self.prog_ids.clone()
    }

    fn counters(&self) -> Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        for (name, idx) in COUNTERS {
            let v = self
                .counters
                .get(&idx.0, 0)
                .map_err(|e| err(&format!("reading sampler counter {name}"), e))?;
            out.insert(*name, v.iter().sum());
        }
        derived_counters(&mut out);
        Ok(out)
    }

    fn raw_samples(&mut self) -> Result<RawSamples> {
        match self.ring.take() {
            Some(r) => RawSamples::new(Box::new(r)),
            None => bail!(
                "raw samples were not enabled when the sampler was loaded, or were already taken"
            ),
        }
    }
}

impl SamplerView for AyaSampler {
    fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    fn attach_info(&self) -> &[AttachInfo] {
        &self.info
    }

    fn read_flows(&mut self) -> Result<Vec<SamplerFlowStats>> {
        let out = table_flows(self.table.fd().as_fd(), &self.cfg, &self.info, self.epoch)?;
        self.epoch = self.epoch.wrapping_add(1);
        self.epoch_map
            .set(0, self.epoch, 0)
            .map_err(|e| err("writing the sampler's report epoch", e))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_object_is_the_sampler() {
        assert_eq!(&SAMPLER_OBJ[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([SAMPLER_OBJ[18], SAMPLER_OBJ[19]]), 247);
        // EM_BPF
    }

    #[cfg(not(feature = "libbpf"))]
    #[test]
    fn clsact_is_refused_in_one_sentence() {
        // Resolving the interface comes first; "lo" exists in every namespace.
        let cfg = SamplerConfig {
            attach: AttachMode::Clsact,
            ..Default::default()
        };
        let Err(e) = AyaSampler::attach(&["lo".parse().unwrap()], cfg) else {
            panic!("clsact accepted under aya");
        };
        let s = format!("{e:#}");
        assert!(s.contains("libbpf") && !s.contains('\n'), "{s}");
    }
}
