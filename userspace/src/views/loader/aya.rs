//! The loader layer over aya 0.14 (pure Rust: ELF, BTF and CO-RE relocation
//! in Rust, no C libbpf):
//!
//! - `.rodata` globals: `EbpfLoader::override_global` by name; map sizes:
//!   `EbpfLoader::map_max_entries`;
//! - each program loaded on its own by its kind (`SockOps::load`,
//!   `Iter::load(target)`, `FExit::load(function)`, ...), so a refused
//!   optional program leaves the rest loaded;
//! - maps taken out of the `Ebpf` after loading, read through their fds;
//!   `.bss` (not mmap-able under aya) read and written as its one array value;
//! - copies sharing maps: aya 0.14 has no "reuse this fd" call, but
//!   `EbpfLoader::map_pin_path` opens a map already pinned at that path
//!   instead of creating it. The first copy pins the shared maps, the next
//!   ones open them. The pins go on a bpffs instance mounted by a thread in a
//!   mount namespace of its own (gone with the thread, seen by nobody else;
//!   works under `ip netns exec`, where /sys/fs/bpf is not bpffs), else in a
//!   private directory under /sys/fs/bpf removed right after loading. The
//!   maps then live on through the programs and our fds. One copy: no pins.
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use aya::maps::{Map as AyaMap, MapData, RingBuf};
use aya::programs::{
    CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, FEntry, FExit, Iter, ProgramError,
    SchedClassifier, SockOps,
};
use aya::{Btf, Ebpf, EbpfLoader};

use super::{
    is_errno, load_error, walk_iter, LoadErrno, Object, ObjectDef, Prog, ProgKind, Settings,
};
use crate::sys::netns::NetNs;
use crate::views::{LoaderKind, RingSource};

/// One loaded copy of an object.
pub(crate) struct AyaObject {
    /// The programs, with their links (dropped with it: detached).
    ebpf: Ebpf,
    maps: Vec<(String, MapData)>,
    def: &'static ObjectDef,
    refused: Vec<(&'static str, anyhow::Error)>,
}

/// An error and its causes on one line (aya's errors keep the errno and the
/// verifier log in their sources). Multi-line parts (a verifier log) are cut
/// to their first line here and logged whole, shown with -v (as libbpf's log).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cur {
        let cs = c.to_string();
        if !parts.iter().any(|p| p.contains(&cs)) {
            parts.push(cs);
        }
        cur = c.source();
    }
    let full = parts.join(": ");
    if !full.contains('\n') {
        return full;
    }
    tracing::info!(target: "aya", "{full}");
    let short: Vec<&str> = parts
        .iter()
        .map(|p| {
            p.lines()
                .next()
                .unwrap_or("")
                .trim_end_matches(['.', ':', ' '])
        })
        .collect();
    format!("{} (details with -v)", short.join(": "))
}

fn err(what: &str, e: impl std::error::Error) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", chain(&e))
}

/// Load every copy (sharing the `shared` maps through pins when there is
/// more than one), then each copy's programs.
pub(super) fn load(
    def: &'static ObjectDef,
    copies: Vec<Settings>,
    shared: &'static [&'static str],
) -> Result<Vec<Box<dyn Object>>> {
    crate::sys::preflight::require_bpf_caps()?;
    let btf = Btf::from_sys_fs().context("reading the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
    let ebpfs = if copies.len() > 1 && !shared.is_empty() {
        with_pins(|pins: &dyn Fn(&str) -> PathBuf| {
            copies
                .iter()
                .map(|s| s.labelled(open(def, s, &btf, shared, Some(pins))))
                .collect::<Result<Vec<_>>>()
        })?
    } else {
        copies
            .iter()
            .map(|s| s.labelled(open(def, s, &btf, shared, None)))
            .collect::<Result<Vec<_>>>()?
    };
    let mut out: Vec<Box<dyn Object>> = Vec::new();
    for (mut ebpf, s) in ebpfs.into_iter().zip(&copies) {
        let mut refused = Vec::new();
        for p in def.progs.iter().filter(|p| !s.skip.contains(&p.name)) {
            match load_prog(&mut ebpf, p, &btf, def) {
                Ok(()) => {}
                Err(e) if s.optional.contains(&p.name) => refused.push((p.name, e)),
                Err(e) => return s.labelled(Err(e)),
            }
        }
        let names: Vec<String> = ebpf.maps().map(|(n, _)| n.to_string()).collect();
        let maps = names
            .into_iter()
            .filter_map(|n| Some((n.clone(), map_data(ebpf.take_map(&n)?)?)))
            .collect();
        out.push(Box::new(AyaObject {
            ebpf,
            maps,
            def,
            refused,
        }));
    }
    Ok(out)
}

/// Parse `def`, apply the settings, create (or, with pins, open) its maps.
fn open(
    def: &ObjectDef,
    s: &Settings,
    btf: &Btf,
    shared: &'static [&'static str],
    pins: Option<&dyn Fn(&str) -> PathBuf>,
) -> Result<Ebpf> {
    let pin_paths: Vec<(&str, PathBuf)> = match pins {
        Some(pins) => shared.iter().map(|m| (*m, pins(m))).collect(),
        None => Vec::new(),
    };
    let mut loader = EbpfLoader::new();
    loader.btf(Some(btf));
    for (m, n) in &s.max_entries {
        loader.map_max_entries(m, *n);
    }
    for g in &s.globals {
        loader.override_global(g.name, &g.bytes[..], true);
    }
    for (m, p) in &pin_paths {
        loader.map_pin_path(m, p.as_path());
    }
    loader.load(def.bytes).map_err(|e| {
        let errno = if is_errno(&e, libc::ENOMEM) {
            LoadErrno::NoMemory
        } else if is_errno(&e, libc::EPERM) && crate::sys::preflight::memlock_limit().is_some() {
            LoadErrno::NotPermitted
        } else {
            LoadErrno::Other
        };
        let e = anyhow::anyhow!("{}", chain(&e));
        if errno != LoadErrno::Other {
            load_error(def.what, &s.memory, errno, e, "")
        } else {
            e.context(format!("opening {}'s BPF object with aya", def.what))
        }
    })
}

/// Load one program by its kind. For a refused program the errno is the
/// reason (as with libbpf); the verifier's log, if any, is a detail shown with -v.
fn load_prog(ebpf: &mut Ebpf, p: &Prog, btf: &Btf, def: &ObjectDef) -> Result<()> {
    let prog = ebpf
        .program_mut(p.name)
        .with_context(|| format!("{} has no program `{}`", def.what, p.name))?;
    let r = match p.kind {
        ProgKind::SockOps => <&mut SockOps>::try_from(prog).and_then(|x| x.load()),
        ProgKind::CgroupSkbIngress | ProgKind::CgroupSkbEgress => {
            <&mut CgroupSkb>::try_from(prog).and_then(|x| x.load())
        }
        ProgKind::Classifier => <&mut SchedClassifier>::try_from(prog).and_then(|x| x.load()),
        ProgKind::Iter(t) => <&mut Iter>::try_from(prog).and_then(|x| x.load(t, btf)),
        ProgKind::FExit(f) => <&mut FExit>::try_from(prog).and_then(|x| x.load(f, btf)),
        ProgKind::FEntry(f) => <&mut FEntry>::try_from(prog).and_then(|x| x.load(f, btf)),
    };
    r.map_err(|e| match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            tracing::info!("{}: verifier log: {verifier_log}", p.name);
            anyhow::Error::from(io_error).context(format!(
                "loading {}'s {} program with aya (verifier or BTF problem; run with -vv)",
                def.what, p.name
            ))
        }
        e => err(
            &format!("loading {}'s {} program with aya", def.what, p.name),
            e,
        ),
    })
}

/// The map's data (its fd), whatever its kind.
fn map_data(m: AyaMap) -> Option<MapData> {
    macro_rules! data {
        ($($v:ident),*) => {
            match m { $(AyaMap::$v(d) => Some(d),)* #[allow(unreachable_patterns)] _ => None }
        };
    }
    data!(
        Array,
        ArrayOfMaps,
        BloomFilter,
        CgroupArray,
        CgroupStorage,
        CgrpStorage,
        CpuMap,
        DevMap,
        DevMapHash,
        HashMap,
        HashOfMaps,
        InodeStorage,
        LpmTrie,
        LruHashMap,
        PerCpuArray,
        PerCpuCgroupStorage,
        PerCpuHashMap,
        PerCpuLruHashMap,
        PerfEventArray,
        ProgramArray,
        Queue,
        ReusePortSockArray,
        RingBuf,
        SockHash,
        SockMap,
        SkStorage,
        Stack,
        StackTraceMap,
        Unsupported,
        XskMap
    )
}

impl AyaObject {
    fn find(&self, map: &str) -> Result<&MapData> {
        self.maps
            .iter()
            .find(|(n, _)| n == map)
            .map(|(_, d)| d)
            .with_context(|| format!("{} has no map `{map}`", self.def.what))
    }

    fn program(&mut self, prog: &str) -> Result<&mut aya::programs::Program> {
        self.ebpf
            .program_mut(prog)
            .with_context(|| format!("{} has no program `{prog}`", self.def.what))
    }

    /// The one value of a data section's array map.
    fn section(&self, section: &'static str) -> Result<Vec<u8>> {
        self.map(section)?
            .lookup(&0u32.to_ne_bytes())?
            .with_context(|| format!("{}'s {section} is empty", self.def.what))
    }
}

impl Object for AyaObject {
    fn loader(&self) -> LoaderKind {
        LoaderKind::Aya
    }

    fn refused(&mut self, prog: &str) -> Option<anyhow::Error> {
        let i = self.refused.iter().position(|(p, _)| *p == prog)?;
        Some(self.refused.remove(i).1)
    }

    fn prog_fd(&self, prog: &str) -> Result<BorrowedFd<'_>> {
        let p = self
            .ebpf
            .program(prog)
            .with_context(|| format!("{} has no program `{prog}`", self.def.what))?;
        Ok(p.fd()
            .map_err(|e| err(&format!("program {prog}"), e))?
            .as_fd())
    }

    fn map_fd(&self, map: &str) -> Result<BorrowedFd<'_>> {
        Ok(self.find(map)?.fd().as_fd())
    }

    fn attach_cgroup(&mut self, prog: &str, cgroup: BorrowedFd<'_>) -> Result<()> {
        let kind = self.def.prog(prog)?.kind;
        let p = self.program(prog)?;
        let skb = |p: &mut aya::programs::Program, t| {
            <&mut CgroupSkb>::try_from(p)?
                .attach(cgroup, t, CgroupAttachMode::Single)
                .map(drop)
        };
        let (what, r) = match kind {
            ProgKind::SockOps => (
                "sock_ops",
                <&mut SockOps>::try_from(p)?
                    .attach(cgroup, CgroupAttachMode::Single)
                    .map(drop),
            ),
            ProgKind::CgroupSkbIngress => ("cgroup_skb", skb(p, CgroupSkbAttachType::Ingress)),
            ProgKind::CgroupSkbEgress => ("cgroup_skb", skb(p, CgroupSkbAttachType::Egress)),
            other => bail!("`{prog}` ({other:?}) is not a cgroup program"),
        };
        r.map_err(|e| err(&format!("attaching {what} with aya"), e))
    }

    fn attach_trace(&mut self, prog: &str) -> Result<()> {
        let kind = self.def.prog(prog)?.kind;
        let p = self.program(prog)?;
        let r = match kind {
            ProgKind::FEntry(_) => <&mut FEntry>::try_from(p)?.attach().map(|_| ()),
            _ => <&mut FExit>::try_from(p)?.attach().map(|_| ()),
        };
        r.map_err(|e| err(&format!("attaching {prog} with aya"), e))
    }

    fn run_iter(&mut self, prog: &str, ns: &NetNs) -> Result<()> {
        let ProgKind::Iter(target) = self.def.prog(prog)?.kind else {
            bail!("`{prog}` is not an iterator");
        };
        let it: &mut Iter = self.program(prog)?.try_into()?;
        let id = it
            .attach()
            .map_err(|e| err(&format!("attaching the iter/{target} program"), e))?;
        let link = it
            .take_link(id)
            .map_err(|e| err("taking the iterator link", e))?;
        walk_iter(ns, &target.to_uppercase(), move || {
            link.into_file()
                .map_err(|e| anyhow::anyhow!("{}", chain(&e)))
        })
    }

    fn ring(&mut self, map: &str) -> Result<Box<dyn RingSource>> {
        let i = self
            .maps
            .iter()
            .position(|(n, _)| n == map)
            .with_context(|| format!("{} has no map `{map}` (or it was taken)", self.def.what))?;
        let (_, data) = self.maps.remove(i);
        let rb =
            RingBuf::try_from(AyaMap::RingBuf(data)).map_err(|e| err(&format!("map {map}"), e))?;
        Ok(Box::new(AyaRing(rb)))
    }

    fn read_data(&self, section: &str, offset: usize, out: &mut [u8]) -> Result<()> {
        let v = self.section(static_section(section)?)?;
        out.copy_from_slice(
            v.get(offset..offset + out.len())
                .with_context(|| format!("reading past {section}"))?,
        );
        Ok(())
    }

    /// A read-modify-write of the whole section (aya does not map it).
    fn write_data(&mut self, section: &str, offset: usize, bytes: &[u8]) -> Result<()> {
        let name = static_section(section)?;
        let mut v = self.section(name)?;
        v.get_mut(offset..offset + bytes.len())
            .with_context(|| format!("writing past {section}"))?
            .copy_from_slice(bytes);
        self.map(name)?.update(&0u32.to_ne_bytes(), &v)
    }
}

/// The data sections an object may have, as `'static` names.
fn static_section(s: &str) -> Result<&'static str> {
    [".bss", ".data", ".rodata"]
        .into_iter()
        .find(|n| *n == s)
        .with_context(|| format!("no data section {s}"))
}

/// A ring buffer loaded by aya.
pub(crate) struct AyaRing(RingBuf<MapData>);

impl RingSource for AyaRing {
    fn poll_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    fn drain(&mut self, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while let Some(item) = self.0.next() {
            f(&item);
            n += 1;
        }
        Ok(n)
    }
}

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
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(&self.0) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if let Err(e) = std::fs::remove_dir(&self.0) {
            tracing::warn!("removing {}: {e}", self.0.display());
        }
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
                    f(&|m: &str| pins.0.join(m))
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
}
