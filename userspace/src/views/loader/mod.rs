//! The loader layer: what a view needs from a BPF loader, written once, with
//! a libbpf ([`libbpf`]) and an aya ([`aya`]) implementation.
//!
//! A view declares its object ([`ObjectDef`]: the embedded `<name>.bpf.o`
//! and its programs) and, per copy, its settings ([`Settings`]: `.rodata`
//! values, map sizes, programs left out, programs the kernel may refuse);
//! [`load`] opens, sizes, configures and loads it with the chosen loader and
//! hands back [`Object`]s to attach and read:
//!
//! - attach: cgroup (sock_ops, cgroup_skb), tracing (fentry/fexit), iterators run in a
//!   network namespace ([`Object::run_iter`]); tc programs are attached by
//!   the view on their fd ([`Object::prog_fd`]: tcx links and clsact filters
//!   take a program fd whoever loaded it);
//! - read and write: maps by name ([`Object::map`] -> [`Map`]: lookup,
//!   update, keys, per-CPU sums, batched walks; one implementation
//!   over the map's fd, since the kernel's map commands do not depend on the
//!   loader), `.bss` variables ([`Object::read_data`], [`Object::write_data`])
//!   and the ring buffer ([`Object::ring`] -> the views' [`RingSource`]).
//!
//! Several copies of one object may share maps (the sampler: one copy per
//! interface): libbpf reuses the first copy's map fds, aya pins them on a
//! private bpffs that the copies after the first open. An optional program
//! (the TCP view's per-ACK hook) that the kernel refuses leaves the rest
//! loaded: libbpf loads the object again without it (one refused program
//! fails a whole libbpf object), aya loads each program on its own.
//!
//! Errors are one sentence: ENOMEM at load is a memory problem (with the
//! view's own hint), anything else names the object and, under aya, cuts a
//! verifier log to its first line (whole with -v).
use std::fs::File;
use std::io::Read;
use std::os::fd::BorrowedFd;

use anyhow::{Context, Result};

use super::{LoaderKind, RingSource};
use crate::sys::netns::{self, NetNs};

#[cfg(feature = "aya")]
pub(crate) mod aya;
#[cfg(feature = "libbpf")]
pub(crate) mod libbpf;

/// An object compiled by build.rs into `$OUT_DIR/<name>.bpf.o`, embedded
/// 8-byte aligned (both loaders parse it in place).
macro_rules! include_object {
    ($name:literal) => {{
        #[repr(C, align(8))]
        struct Aligned<B: ?Sized>(B);
        static ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
            env!("OUT_DIR"),
            "/",
            $name,
            ".bpf.o"
        )));
        &ALIGNED.0
    }};
}
pub(crate) use include_object;

/// `.rodata` values from a generated layout struct (`crate::bpf::*::types::rodata`):
/// each field's name (= the C global's), offset and bytes. A global renamed in
/// C fails the build here.
macro_rules! globals {
    ($ty:ty, $v:expr, [$($f:ident),* $(,)?]) => {
        vec![$($crate::views::loader::Global {
            name: stringify!($f),
            offset: std::mem::offset_of!($ty, $f),
            bytes: $crate::views::loader::value_bytes(&$v.$f).to_vec(),
        }),*]
    };
}
pub(crate) use globals;

/// The bytes of a plain integer value (a `.rodata` field).
pub(crate) fn value_bytes<T: Copy + Into<u64>>(v: &T) -> &[u8] {
    // SAFETY: `T` is an integer type (Into<u64>): no padding, no pointers.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// How a program is loaded and attached (aya needs it to load; libbpf reads
/// it from the ELF section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProgKind {
    /// `SEC("sockops")`, attached to a cgroup.
    SockOps,
    /// `SEC("cgroup_skb/ingress")`, attached to a cgroup.
    #[cfg_attr(not(feature = "example-view"), allow(dead_code))]
    CgroupSkbIngress,
    /// `SEC("cgroup_skb/egress")`, attached to a cgroup.
    #[cfg_attr(not(feature = "example-view"), allow(dead_code))]
    CgroupSkbEgress,
    /// `SEC("iter/<target>")`, run in a namespace.
    Iter(&'static str),
    /// `SEC("fexit/<function>")`.
    FExit(&'static str),
    /// `SEC("fentry/<function>")` (loaded and attached by both loaders; no view has one yet).
    #[allow(dead_code)]
    FEntry(&'static str),
    /// `SEC("classifier")`: a tc program (tcx link or clsact filter).
    Classifier,
}

/// One program of an object: its name (bpftool's, at most 15 characters) and kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Prog {
    pub name: &'static str,
    pub kind: ProgKind,
}

/// An embedded object and what the loaders need to know of it.
pub(crate) struct ObjectDef {
    /// For messages: "the TCP view".
    pub what: &'static str,
    /// libbpf's object name (its internal maps' kernel names start with it).
    #[cfg_attr(not(feature = "libbpf"), allow(dead_code))]
    pub name: &'static str,
    pub bytes: &'static [u8],
    pub progs: &'static [Prog],
}

impl ObjectDef {
    pub(crate) fn prog(&self, name: &str) -> Result<&Prog> {
        self.progs
            .iter()
            .find(|p| p.name == name)
            .with_context(|| format!("{} has no program `{name}`", self.what))
    }
}

/// One `.rodata` variable (see [`globals!`]).
#[derive(Debug, Clone)]
pub(crate) struct Global {
    pub name: &'static str,
    /// Its offset in `.rodata` (libbpf writes there; aya patches by name).
    #[cfg_attr(not(feature = "libbpf"), allow(dead_code))]
    pub offset: usize,
    pub bytes: Vec<u8>,
}

/// The settings of one copy of an object, applied before it is loaded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    pub globals: Vec<Global>,
    /// Map sizes (`max_entries`) other than the object's.
    pub max_entries: Vec<(&'static str, u32)>,
    /// Programs not loaded at all.
    pub skip: Vec<&'static str>,
    /// Programs the kernel may refuse: the rest loads without them, and
    /// [`Object::refused`] says why.
    pub optional: Vec<&'static str>,
    /// What ENOMEM at load means for this object, e.g. "its maps of 4096
    /// flows (lower --max-flows, ...)".
    pub memory: String,
    /// Context of this copy's errors, e.g. "loading the sampler programs
    /// for ns:veth0" (empty: none).
    pub label: String,
}

impl Settings {
    /// `r` with this copy's label as context.
    pub(crate) fn labelled<T>(&self, r: Result<T>) -> Result<T> {
        if self.label.is_empty() {
            r
        } else {
            r.with_context(|| self.label.clone())
        }
    }
}

/// Load one copy of `def` per entry of `copies` with `kind`; the copies
/// after the first share the first one's maps named in `shared`.
pub(crate) fn load(
    kind: LoaderKind,
    def: &'static ObjectDef,
    copies: Vec<Settings>,
    shared: &'static [&'static str],
) -> Result<Vec<Box<dyn Object>>> {
    match kind {
        #[cfg(feature = "libbpf")]
        LoaderKind::Libbpf => libbpf::load(def, copies, shared),
        #[cfg(feature = "aya")]
        LoaderKind::Aya => aya::load(def, copies, shared),
        #[allow(unreachable_patterns)]
        other => Err(super::passive::not_built(other)),
    }
}

/// A loaded object, whichever loader loaded it. Links made through it are
/// kept inside it: they detach when it is dropped, or when the process dies.
pub(crate) trait Object {
    fn loader(&self) -> LoaderKind;
    /// Why an optional program was left out (once; `None`: it is loaded).
    fn refused(&mut self, prog: &str) -> Option<anyhow::Error>;
    /// A loaded program's fd (for its id and for tc attachments).
    fn prog_fd(&self, prog: &str) -> Result<BorrowedFd<'_>>;
    /// A map's fd, by its name in the C source (`.bss` for the `.bss` section).
    fn map_fd(&self, map: &str) -> Result<BorrowedFd<'_>>;
    /// Attach a cgroup program (sock_ops, cgroup_skb ingress or egress, by
    /// its [`ProgKind`]) to the cgroup open at `cgroup` (a bpf_link).
    fn attach_cgroup(&mut self, prog: &str, cgroup: BorrowedFd<'_>) -> Result<()>;
    /// Attach a fentry/fexit program (a bpf_link).
    fn attach_trace(&mut self, prog: &str) -> Result<()>;
    /// Attach an iterator and run it to its end inside `ns` (an iterator walks
    /// only the namespace of the thread that creates it); then detach it.
    fn run_iter(&mut self, prog: &str, ns: &NetNs) -> Result<()>;
    /// The ring buffer `map` as the views' raw-sample source (once).
    fn ring(&mut self, map: &str) -> Result<Box<dyn RingSource>>;
    /// Read `out.len()` bytes at `offset` of a data section's variables (`.bss`).
    fn read_data(&self, section: &str, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Write `bytes` at `offset` of a data section's variables (`.bss`).
    fn write_data(&mut self, section: &str, offset: usize, bytes: &[u8]) -> Result<()>;

    /// A map, by name, to read and write.
    fn map(&self, name: &'static str) -> Result<Map<'_>> {
        Ok(Map {
            name,
            fd: self.map_fd(name)?,
        })
    }

    /// A program's kernel id (bpftool prog show id N; 0 if unknown).
    fn prog_id(&self, prog: &str) -> u32 {
        self.prog_fd(prog)
            .ok()
            .and_then(|fd| crate::sys::bpf::prog_id(fd).ok())
            .unwrap_or(0)
    }

    /// A `u32`/`u64` variable of a data section (see [`Object::read_data`]).
    fn read_u64(&self, section: &str, offset: usize, size: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read_data(section, offset, &mut b[..size.min(8)])?;
        Ok(u64::from_ne_bytes(b))
    }
}

/// A map of a loaded object, accessed by key and value bytes through its fd.
#[derive(Clone, Copy)]
pub(crate) struct Map<'a> {
    name: &'static str,
    fd: BorrowedFd<'a>,
}

impl<'a> Map<'a> {
    fn info(&self) -> Result<crate::sys::bpf::MapInfo> {
        crate::sys::bpf::map_info(self.fd).with_context(|| format!("map {}", self.name))
    }

    /// Write `value` under `key` (any flags: create or replace).
    pub(crate) fn update(&self, key: &[u8], value: &[u8]) -> Result<()> {
        crate::sys::bpf::update(self.fd, Some(key), value, 0)
            .with_context(|| format!("writing to map {}", self.name))
    }

    /// The value under `key` (`None`: no such key).
    #[cfg_attr(not(feature = "aya"), allow(dead_code))]
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = vec![0u8; self.info()?.value_size as usize];
        let found = crate::sys::bpf::lookup(self.fd, key, &mut v)
            .with_context(|| format!("reading map {}", self.name))?;
        Ok(found.then_some(v))
    }

    /// Every key (a walk with BPF_MAP_GET_NEXT_KEY).
    pub(crate) fn keys(&self) -> Result<Vec<Vec<u8>>> {
        let size = self.info()?.key_size as usize;
        let mut out: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut next = vec![0u8; size];
            let more = crate::sys::bpf::next_key(self.fd, out.last().map(|k| &k[..]), &mut next)
                .with_context(|| format!("walking map {}", self.name))?;
            if !more {
                return Ok(out);
            }
            out.push(next);
        }
    }

    /// The sum over CPUs of the `u64` at the start of a per-CPU value
    /// (`Ok(None)`: no such key).
    pub(crate) fn percpu_sum(&self, key: &[u8]) -> Result<Option<u64>> {
        let stride = (self.info()?.value_size as usize).next_multiple_of(8);
        let cpus = crate::sys::bpf::possible_cpus().context("counting the possible CPUs")?;
        let mut v = vec![0u8; stride * cpus];
        if !crate::sys::bpf::lookup(self.fd, key, &mut v)
            .with_context(|| format!("reading map {}", self.name))?
        {
            return Ok(None);
        }
        Ok(Some(
            v.chunks_exact(stride)
                .map(|c| u64::from_ne_bytes(c[..8].try_into().unwrap_or([0; 8])))
                .fold(0u64, u64::wrapping_add),
        ))
    }
}

/// Create an iterator from its link inside `ns` (`create`, on a thread in
/// that namespace) and read it to its end: both loaders' [`Object::run_iter`].
pub(crate) fn walk_iter(
    ns: &NetNs,
    what: &str,
    create: impl FnOnce() -> Result<File> + Send,
) -> Result<()> {
    let name = ns.name.clone();
    netns::scoped(ns, move || -> Result<()> {
        let mut it =
            create().with_context(|| format!("creating the {what} iterator in '{name}'"))?;
        let mut sink = Vec::new();
        it.read_to_end(&mut sink)
            .with_context(|| format!("walking {what} sockets in '{name}'"))?;
        Ok(())
    })
}

/// Whether `e` or one of its causes is the OS error `errno` (ENOMEM: a map
/// the kernel could not allocate): aya's errors (libbpf's carry their kind).
#[cfg_attr(not(feature = "aya"), allow(dead_code))]
pub(crate) fn is_errno(e: &(dyn std::error::Error + 'static), errno: i32) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(errno) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// How a load failed, as far as the sentence for it goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadErrno {
    /// ENOMEM: a map the kernel could not allocate.
    NoMemory,
    /// EPERM: with a finite RLIMIT_MEMLOCK, what kernels before 5.11 say when
    /// the maps exceed it.
    NotPermitted,
    Other,
}

/// A failed load in one sentence: ENOMEM is a memory problem (`memory`:
/// the view's hint, e.g. "its maps of 4096 flows (lower --max-flows, ...)"),
/// EPERM under a finite RLIMIT_MEMLOCK that limit (kernels before 5.11),
/// anything else a verifier or BTF problem (`hint`: where the details are).
pub(crate) fn load_error(
    what: &str,
    memory: &str,
    errno: LoadErrno,
    err: anyhow::Error,
    hint: &str,
) -> anyhow::Error {
    if let (LoadErrno::NotPermitted, Some(why)) = (errno, crate::sys::bpf::seccomp_refusal()) {
        return anyhow::anyhow!("loading {what} into the kernel: {why}");
    }
    let memlock = crate::sys::preflight::memlock_limit();
    if let (LoadErrno::NotPermitted, Some(limit)) = (errno, memlock) {
        return anyhow::anyhow!(
            "loading {what} into the kernel: not permitted with RLIMIT_MEMLOCK at {limit} bytes \
             (kernels before 5.11 charge BPF maps to it): raise it (systemd LimitMEMLOCK=infinity, \
             ulimit -l unlimited, or CAP_SYS_RESOURCE so that rttscope raises it): {err}"
        );
    }
    if errno == LoadErrno::NoMemory {
        let memory = if memory.is_empty() {
            "its maps (check the memory cgroup and RLIMIT_MEMLOCK)"
        } else {
            memory
        };
        anyhow::anyhow!("loading {what} into the kernel: not enough memory for {memory}: {err}")
    } else {
        err.context(format!(
            "loading {what} into the kernel (verifier or BTF problem; {hint})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENOMEM at load is reported as memory, with the size asked for; EPERM under a finite
    /// RLIMIT_MEMLOCK names the limit; anything else keeps the verifier/BTF hint.
    #[test]
    fn enomem_and_memlock_at_load_are_memory_problems() {
        let io = std::io::Error::from_raw_os_error(libc::ENOMEM);
        assert!(is_errno(&io, libc::ENOMEM));
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOMEM))
            .context("creating map");
        assert!(is_errno(e.as_ref(), libc::ENOMEM));
        let einval = std::io::Error::from_raw_os_error(libc::EINVAL);
        assert!(!is_errno(&einval, libc::ENOMEM));
        let e = load_error(
            "the TCP view",
            "its maps of 4096 flows",
            LoadErrno::NoMemory,
            anyhow::anyhow!("Cannot allocate memory"),
            "-vv",
        )
        .to_string();
        assert!(
            e.contains("not enough memory for its maps of 4096 flows") && !e.contains("verifier"),
            "{e}"
        );
        let e = load_error(
            "the TCP view",
            "",
            LoadErrno::Other,
            anyhow::anyhow!("EINVAL"),
            "-vv",
        );
        assert!(
            format!("{e:#}").contains("verifier or BTF problem") && !e.to_string().contains('\n'),
            "{e:#}"
        );
        // EPERM with a finite soft limit (lowering it is always allowed; put back after)
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).unwrap();
        setrlimit(Resource::RLIMIT_MEMLOCK, 65536, hard).unwrap();
        let eperm = anyhow::anyhow!("Operation not permitted");
        let e = load_error("the TCP view", "", LoadErrno::NotPermitted, eperm, "-vv").to_string();
        setrlimit(Resource::RLIMIT_MEMLOCK, soft, hard).unwrap();
        assert!(
            e.contains("RLIMIT_MEMLOCK at 65536 bytes")
                && e.contains("before 5.11")
                && !e.contains('\n'),
            "{e}"
        );
    }

    #[test]
    fn objects_are_embedded_bpf_elf() {
        for obj in [
            crate::views::tcp::attach::OBJECT.bytes,
            crate::views::sampler::attach::OBJECT.bytes,
        ] {
            assert_eq!(&obj[..4], b"\x7fELF");
            assert_eq!(u16::from_le_bytes([obj[18], obj[19]]), 247); // EM_BPF
            assert_eq!(obj.as_ptr() as usize % 8, 0);
        }
    }

    #[test]
    fn globals_name_offset_and_bytes() {
        use crate::bpf::tcp::types::rodata;
        let ro = rodata {
            cfg_netns_filter: 0,
            cfg_port_filter: 0,
            cfg_addr_filter: 0,
            cfg_raw: 1,
            cfg_max_slots: 7,
            cfg_hint_mask: 0,
            cfg_pool_entries: 64,
        };
        let g = globals!(rodata, ro, [cfg_raw, cfg_max_slots]);
        assert_eq!(g[0].name, "cfg_raw");
        assert_eq!(g[0].offset, std::mem::offset_of!(rodata, cfg_raw));
        assert_eq!(g[1].bytes, 7u32.to_ne_bytes());
    }
}
